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
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
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
	var namespace string
	explain := &cobra.Command{
		Use:   "explain JOB",
		Short: "Show where a Job's pods were placed and why, or why they wait",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := client()
			if err != nil {
				return err
			}
			return explainJob(cmd.Context(), c, cmd, namespace, args[0])
		},
	}
	explain.Flags().StringVarP(&namespace, "namespace", "n", "default", "Namespace of the Job (or of the gputopo.dev/group pods)")
	root.AddCommand(explain)
	root.AddCommand(newSimulateCmd())
	return root
}

// explainJob gathers the pods of a Job, or of a gputopo.dev/group of that
// name, and the events about them.
func explainJob(ctx context.Context, c kubernetes.Interface, cmd *cobra.Command, ns, name string) error {
	pods, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=" + name})
	if err != nil {
		return fmt.Errorf("list pods of Job %s/%s: %w", ns, name, err)
	}
	items := pods.Items
	if len(items) == 0 {
		all, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return fmt.Errorf("list pods in %s: %w", ns, err)
		}
		for _, p := range all.Items {
			if p.Annotations[placement.AnnotationGroup] == name {
				items = append(items, p)
			}
		}
	}
	evs, err := c.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list events in %s: %w", ns, err)
	}
	subjects := map[string]bool{name: true}
	for _, p := range items {
		subjects[p.Name] = true
	}
	var mine []v1.Event
	for _, e := range evs.Items {
		if subjects[e.InvolvedObject.Name] {
			mine = append(mine, e)
		}
	}
	return cli.Explain(cmd.OutOrStdout(), ns+"/"+name, items, mine)
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
	views := cli.BuildViews(nodes.Items, rs.Items, claims.Items, topology.DefaultLabelMapping())
	return cli.RenderTree(cmd.OutOrStdout(), views)
}
