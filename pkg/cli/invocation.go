package cli

import (
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
)

// Names the CLI is installed and invoked under.
const (
	// CommandName is the CLI's own executable.
	CommandName = "gputopo"
	// PluginName is the executable kubectl finds as the plugin `kubectl gputopo`.
	PluginName = "kubectl-" + CommandName
	// PluginCompletionName is the executable kubectl (1.26 and later) runs
	// to complete `kubectl gputopo ...`: it passes the words after
	// `kubectl gputopo`, the last one the word being completed.
	PluginCompletionName = "kubectl_complete-" + CommandName
)

// Invocation is how the executable was started, from its name.
type Invocation struct {
	// Name is the root command's name: the executable as typed, which a
	// shell completion script is registered for.
	Name string
	// Display is how help, usage, examples and errors name the command:
	// "kubectl gputopo" for the plugin, "gputopo" otherwise.
	Display string
	// Complete says the executable was started as PluginCompletionName:
	// its arguments are words to complete, not a command.
	Complete bool
}

// Invoked reads how the executable was started from argv0 (os.Args[0]).
// A name starting with "kubectl-" or "kubectl_complete-" is the kubectl
// plugin; any other name is the plain CLI.
func Invoked(argv0 string) Invocation {
	base := strings.TrimSuffix(filepath.Base(argv0), ".exe")
	switch {
	case strings.HasPrefix(base, "kubectl_complete-"):
		return Invocation{Name: PluginName, Display: "kubectl " + CommandName, Complete: true}
	case strings.HasPrefix(base, "kubectl-"):
		return Invocation{Name: PluginName, Display: "kubectl " + CommandName}
	}
	return Invocation{Name: CommandName, Display: CommandName}
}

// Args are the arguments the root command runs with: for
// PluginCompletionName, cobra's completion request for the words kubectl
// passes.
func (i Invocation) Args(args []string) []string {
	if i.Complete {
		return append([]string{cobra.ShellCompRequestCmd}, args...)
	}
	return args
}
