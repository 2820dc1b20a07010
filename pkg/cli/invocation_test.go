package cli_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gputopo/gputopo/pkg/cli"
)

func TestInvoked(t *testing.T) {
	for argv0, want := range map[string]cli.Invocation{
		"gputopo":                                 {Name: "gputopo", Display: "gputopo"},
		"/tmp/go-build1/b001/exe/gputopo":         {Name: "gputopo", Display: "gputopo"},
		"/home/u/.krew/bin/kubectl-gputopo":       {Name: "kubectl-gputopo", Display: "kubectl gputopo"},
		"kubectl-gputopo.exe":                     {Name: "kubectl-gputopo", Display: "kubectl gputopo"},
		"/usr/local/bin/kubectl_complete-gputopo": {Name: "kubectl-gputopo", Display: "kubectl gputopo", Complete: true},
	} {
		if diff := cmp.Diff(want, cli.Invoked(argv0)); diff != "" {
			t.Errorf("Invoked(%q) (-want +got):\n%s", argv0, diff)
		}
	}
	args := []string{"explain", "tr"}
	if diff := cmp.Diff([]string{"__complete", "explain", "tr"}, cli.Invoked("kubectl_complete-gputopo").Args(args)); diff != "" {
		t.Errorf("completion executable's args (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(args, cli.Invoked("kubectl-gputopo").Args(args)); diff != "" {
		t.Errorf("plugin's args (-want +got):\n%s", diff)
	}
}
