// Command gputopo inspects gputopo clusters: `gputopo topology` draws the
// core → spine → leaf → node → NVLink tree with allocated and free GPUs,
// `gputopo explain` says where a Job's pods went and which rung of their
// claims' preference ladders they got. Installed as kubectl-gputopo it is
// the kubectl plugin `kubectl gputopo`, with kubectl's connection flags.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"

	"github.com/gputopo/gputopo/pkg/cli"
)

func main() {
	inv := cli.Invoked(os.Args[0])
	root := newRoot(inv, os.Stdout, os.Stderr)
	root.SetArgs(inv.Args(os.Args[1:]))
	if err := root.Execute(); err != nil {
		os.Exit(1)
	}
}

// newRoot builds the command tree, writing to stdout and stderr; inv
// names it in help, usage, examples, errors and completion scripts.
func newRoot(inv cli.Invocation, stdout, stderr io.Writer) *cobra.Command {
	config := genericclioptions.NewConfigFlags(true)
	root := &cobra.Command{
		Use:          inv.Name,
		Short:        "Inspect GPU topology and placements of a gputopo cluster",
		SilenceUsage: true,
		Annotations:  map[string]string{cobra.CommandDisplayNameAnnotation: inv.Display},
	}
	// Before the completion command is added, which keeps the writer it
	// finds.
	root.SetOut(stdout)
	root.SetErr(stderr)
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
		Example: examples(inv,
			"topology", "the tree, coloured on a terminal",
			"topology -o wide", "which Job holds each allocated GPU",
			"topology -o svg > topology.svg", "a picture"),
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
	topo.Flags().StringVarP(&topoOut, "output", "o", cli.OutputTable, "Output format: "+cli.OutputsHelp(cli.TopologyOutputs))
	root.AddCommand(topo)

	var explainOut string
	var all bool
	var target cli.Target
	explain := &cobra.Command{
		Use:   "explain (NAME | TYPE/NAME)",
		Short: "Show where a Job's pods were placed and why, or why they wait",
		Long: `Shows the domain the controller chose for a Job, a JobSet, a gputopo.dev/group
of pods or one pod, the node of each pod, why pods still wait, which rung of
a firstAvailable claim each pod got, and the controller's decisions.

For a pod that gputopo does not hold (no gputopo.dev/placement), it says
what keeps it waiting: a missing ResourceClaim or ResourceClaimTemplate, a
claim that no device of any node matches (and the attribute its selector
misspells, a share while no GPU is shared, device taints), GPUs all taken,
nodes tainted or NotReady, the scheduler's message, other scheduling gates,
or what keeps a bound pod from starting.

It takes ` + cli.TargetForms + `.`,
		Example: examples(inv,
			"explain train -n ml", "the Job train in namespace ml (else the group or pod train)",
			"explain job/train -A -o json", "the Job train, found in any namespace, as JSON",
			"explain pod/train-0-x7k2p", "one pod",
			"explain jobset/sweep", "every pod of the JobSet sweep"),
		Args: cobra.ExactArgs(1),
		PreRunE: func(_ *cobra.Command, args []string) error {
			var err error
			if target, err = cli.ParseTarget(args[0]); err != nil {
				return err
			}
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
			e, err := cli.FetchExplanation(cmd.Context(), c, ns, all, target)
			if err != nil {
				return err
			}
			return cli.PrintExplanation(cmd.OutOrStdout(), e, explainOut, color(cmd))
		},
	}
	explain.Flags().StringVarP(&explainOut, "output", "o", cli.OutputTable, "Output format: "+cli.OutputsHelp(cli.ExplainOutputs))
	explain.Flags().BoolVarP(&all, "all-namespaces", "A", false, "Find the Job, JobSet, group or pod in any namespace")
	root.AddCommand(explain)
	root.AddCommand(newSimulateCmd(inv))

	var versionOut string
	version := &cobra.Command{
		Use:     "version",
		Short:   "Print the version of " + inv.Display,
		Example: examples(inv, "version", "the version, commit and Go it was built with", "version -o json", "the same as JSON"),
		Args:    cobra.NoArgs,
		PreRunE: func(*cobra.Command, []string) error {
			if versionOut == "" {
				return nil
			}
			return cli.CheckOutput(versionOut, cli.VersionOutputs)
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cli.PrintVersion(cmd.OutOrStdout(), cli.CurrentVersion(), versionOut)
		},
	}
	version.Flags().StringVarP(&versionOut, "output", "o", "", "Output format: "+cli.OutputsHelp(cli.VersionOutputs)+" (default: text)")
	root.AddCommand(version)
	addCompletion(root, inv)
	return root
}

// examples formats pairs of arguments and what they show as a command's
// examples, each run as inv names the command.
func examples(inv cli.Invocation, pairs ...string) string {
	var b strings.Builder
	for i := 0; i+1 < len(pairs); i += 2 {
		if i > 0 {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "  # %s\n  %s %s\n", pairs[i+1], inv.Display, pairs[i])
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// addCompletion adds cobra's completion command, registered for the
// executable's own name (never for kubectl, whose completion it would
// replace), and says how kubectl completes the plugin.
func addCompletion(root *cobra.Command, inv cli.Invocation) {
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() != "completion" {
			continue
		}
		c.Long += fmt.Sprintf(`
The script completes the command %[1]s. kubectl (1.26 and later) completes
"kubectl %[2]s ..." itself by running %[3]s from the PATH: make build puts
it in bin/ beside %[4]s; no script is sourced for it.
`, inv.Name, cli.CommandName, cli.PluginCompletionName, cli.PluginName)
	}
}
