// Command gputopo inspects gputopo clusters: `gputopo topology` draws the
// spine → leaf → node → NVLink tree with allocated and free GPUs. It also
// works as the kubectl plugin `kubectl gputopo` when installed as
// kubectl-gputopo.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gputopo/gputopo/pkg/cli"
	"github.com/gputopo/gputopo/pkg/topology"
)

func main() {
	if err := newRoot().Execute(); err != nil {
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	var kubeconfig string
	root := &cobra.Command{
		Use:           "gputopo",
		Short:         "Inspect GPU topology and placements of a gputopo cluster",
		SilenceUsage:  true,
		SilenceErrors: false,
	}
	root.PersistentFlags().StringVar(&kubeconfig, "kubeconfig", "", "Kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
	client := func() (kubernetes.Interface, error) {
		rules := clientcmd.NewDefaultClientConfigLoadingRules()
		rules.ExplicitPath = kubeconfig
		cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("load kubeconfig: %w", err)
		}
		return kubernetes.NewForConfig(cfg)
	}
	root.AddCommand(&cobra.Command{
		Use:   "topology",
		Short: "Draw spine → leaf → node → NVLink domains with allocated and free GPUs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := client()
			if err != nil {
				return err
			}
			return drawTopology(cmd.Context(), c, cmd)
		},
	})
	return root
}

func drawTopology(ctx context.Context, c kubernetes.Interface, cmd *cobra.Command) error {
	nodes, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	rs, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list ResourceSlices: %w", err)
	}
	claims, err := c.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list ResourceClaims: %w", err)
	}
	views := cli.BuildViews(nodes.Items, rs.Items, claims.Items, topology.DefaultNetworkLabels())
	return cli.RenderTree(cmd.OutOrStdout(), views)
}
