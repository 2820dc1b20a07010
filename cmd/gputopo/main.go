// Command gputopo inspects gputopo clusters: `gputopo topology` draws the
// core → spine → leaf → node → NVLink tree with allocated and free GPUs,
// `gputopo explain` says where a Job's pods went and which rung of their
// claims' preference ladders they got. Installed as kubectl-gputopo it is
// the kubectl plugin `kubectl gputopo`, with kubectl's connection flags.
package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"

	"github.com/gputopo/gputopo/pkg/cli"
)

func main() {
	if err := newRoot().Execute(); err != nil {
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	name := "gputopo"
	if strings.HasPrefix(filepath.Base(os.Args[0]), "kubectl-") {
		name = "kubectl gputopo"
	}
	config := genericclioptions.NewConfigFlags(true)
	root := &cobra.Command{
		Use:          name,
		Short:        "Inspect GPU topology and placements of a gputopo cluster",
		SilenceUsage: true,
	}
	config.AddFlags(root.PersistentFlags())
	var mappingRef string
	root.PersistentFlags().StringVar(&mappingRef, "label-mapping", "", "ConfigMap NAMESPACE/NAME with the node-label mapping; default: the gputopo-label-mapping ConfigMap of any namespace, else the built-in defaults")
	client := func() (kubernetes.Interface, error) {
		raw, err := config.ToRawKubeConfigLoader().RawConfig()
		if err != nil {
			return nil, fmt.Errorf("load kubeconfig: %w", err)
		}
		if len(raw.Clusters) == 0 && *config.APIServer == "" && os.Getenv("KUBERNETES_SERVICE_HOST") == "" {
			return nil, errors.New("no cluster configured: set $KUBECONFIG or pass --kubeconfig (and --context)")
		}
		cfg, err := config.ToRESTConfig()
		if err != nil {
			return nil, fmt.Errorf("load kubeconfig: %w", err)
		}
		return kubernetes.NewForConfig(cfg)
	}
	color := func(cmd *cobra.Command) bool {
		f, ok := cmd.OutOrStdout().(*os.File)
		return ok && term.IsTerminal(int(f.Fd())) && os.Getenv("NO_COLOR") == ""
	}

	var topoOut string
	topo := &cobra.Command{
		Use:   "topology",
		Short: "Draw core → spine → leaf → node → NVLink domains with allocated and free GPUs",
		Long: `Draws every node with gputopo GPUs under its leaf, spine and core switch,
as the cluster's label mapping places it, with each GPU free, allocated (and
to which Job) or unhealthy. -o dot writes a Graphviz graph, -o svg a picture.`,
		Args: cobra.NoArgs,
		PreRunE: func(*cobra.Command, []string) error {
			return cli.CheckOutput(topoOut, cli.TopologyOutputs)
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := client()
			if err != nil {
				return err
			}
			t, err := cli.FetchTopology(cmd.Context(), c, mappingRef)
			if err != nil {
				return err
			}
			return cli.PrintTopology(cmd.OutOrStdout(), t, topoOut, color(cmd))
		},
	}
	topo.Flags().StringVarP(&topoOut, "output", "o", cli.OutputTable, "Output format: "+strings.Join(cli.TopologyOutputs, "|"))
	root.AddCommand(topo)

	var explainOut string
	var all bool
	explain := &cobra.Command{
		Use:   "explain JOB",
		Short: "Show where a Job's pods were placed and why, or why they wait",
		Long: `Shows the domain the controller chose for a Job (or a gputopo.dev/group of
pods), the node of each pod, why pods still wait, which rung of a
firstAvailable claim each pod got, and the controller's decisions.`,
		Args: cobra.ExactArgs(1),
		PreRunE: func(*cobra.Command, []string) error {
			return cli.CheckOutput(explainOut, cli.ExplainOutputs)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := client()
			if err != nil {
				return err
			}
			ns, _, err := config.ToRawKubeConfigLoader().Namespace()
			if err != nil {
				return fmt.Errorf("read the namespace from the kubeconfig: %w", err)
			}
			e, err := cli.FetchExplanation(cmd.Context(), c, ns, all, args[0])
			if err != nil {
				return err
			}
			return cli.PrintExplanation(cmd.OutOrStdout(), e, explainOut, color(cmd))
		},
	}
	explain.Flags().StringVarP(&explainOut, "output", "o", cli.OutputTable, "Output format: "+strings.Join(cli.ExplainOutputs, "|"))
	explain.Flags().BoolVarP(&all, "all-namespaces", "A", false, "Find the Job in any namespace")
	root.AddCommand(explain)
	root.AddCommand(newSimulateCmd())
	return root
}
