package main

import (
	"strings"
	"sync/atomic"
	"testing"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/gputopo/gputopo/pkg/controller"
	"github.com/gputopo/gputopo/pkg/topology"
)

// /readyz: a replica waiting for the leader Lease is ready with the body
// "standby"; the leader is not ready until it has synced every group once,
// nor is a controller run without leader election.
func TestReadinessStandbyWhileWaitingForTheLease(t *testing.T) {
	ctrl, err := controller.New(controller.Config{Client: fake.NewClientset(), Network: topology.DefaultLabelMapping()})
	if err != nil {
		t.Fatal(err)
	}
	if ctrl.Ready() {
		t.Fatal("a controller that never ran is ready")
	}
	var leading atomic.Bool
	type answer struct {
		Ready bool
		Body  string
	}
	ask := func(leaderElect bool) answer {
		ok, body := readiness(ctrl, leaderElect, &leading)()
		return answer{ok, body}
	}
	want := answer{true, "standby: waiting for the leader Lease"}
	if got := ask(true); got != want {
		t.Errorf("waiting for the Lease: %+v, want %+v", got, want)
	}
	leading.Store(true)
	if got := ask(true); got.Ready || !strings.HasPrefix(got.Body, "syncing") {
		t.Errorf("leading, not synced: %+v, want not ready, syncing", got)
	}
	leading.Store(false)
	if got := ask(false); got.Ready || !strings.HasPrefix(got.Body, "syncing") {
		t.Errorf("without leader election, not synced: %+v, want not ready, syncing", got)
	}
}
