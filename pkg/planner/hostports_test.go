package planner_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/gputopo/gputopo/pkg/planner"
)

func port(p int32, protocol v1.Protocol, ip string) v1.ContainerPort {
	return v1.ContainerPort{ContainerPort: p, HostPort: p, Protocol: protocol, HostIP: ip}
}

// TestPortsConflict: kube-scheduler's rule for two host ports on a node.
func TestPortsConflict(t *testing.T) {
	for name, tc := range map[string]struct {
		a, b v1.ContainerPort
		want bool
	}{
		"same port":                    {port(8080, "", ""), port(8080, v1.ProtocolTCP, ""), true},
		"another port":                 {port(8080, "", ""), port(8081, "", ""), false},
		"another protocol":             {port(8080, v1.ProtocolUDP, ""), port(8080, v1.ProtocolTCP, ""), false},
		"two addresses":                {port(8080, "", "10.0.0.1"), port(8080, "", "10.0.0.2"), false},
		"one address and the wildcard": {port(8080, "", "10.0.0.1"), port(8080, "", "0.0.0.0"), true},
		"the same address":             {port(8080, "", "10.0.0.1"), port(8080, "", "10.0.0.1"), true},
		"a container port only":        {v1.ContainerPort{ContainerPort: 8080}, v1.ContainerPort{ContainerPort: 8080}, false},
	} {
		for _, pair := range [][2]v1.ContainerPort{{tc.a, tc.b}, {tc.b, tc.a}} {
			if got := planner.PortsConflict([]v1.ContainerPort{pair[0]}, []v1.ContainerPort{pair[1]}); got != tc.want {
				t.Errorf("%s: PortsConflict(%v, %v) = %v, want %v", name, pair[0], pair[1], got, tc.want)
			}
		}
	}
}

// TestHostPortsKeepPodsApart: pods that ask for one host port go onto
// different nodes, and off the nodes where a pod outside the job or a
// pinned pod holds it, as kube-scheduler's NodePorts filter keeps them.
func TestHostPortsKeepPodsApart(t *testing.T) {
	c := labelled().Obj(t)
	held := func(node string, ports ...v1.ContainerPort) planner.Neighbour {
		return planner.Neighbour{Node: node, Bound: true, Pod: planner.Pod{Name: "h-" + node, HostPorts: ports}}
	}
	tests := map[string]struct {
		pods    int
		ports   []v1.ContainerPort
		held    []planner.Neighbour
		pinned  string // a pinned pod on this node holds the port
		clash   bool   // the pods stand for members asking for one port
		want    *placed
		refused bool
	}{
		"without ports both share l0n0": {
			pods: 2,
			want: &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n0", "l0n0")},
		},
		"one port: a node each": {
			pods: 2, ports: []v1.ContainerPort{port(29500, "", "")},
			want: &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n0", "l0n1")},
		},
		"a pod outside the job holds the port": {
			pods: 1, ports: []v1.ContainerPort{port(29500, "", "")}, held: []planner.Neighbour{held("l0n0", port(29500, "", ""))},
			want: &placed{Domain: planner.Domain{Level: planner.LevelNode, Names: []string{"l0n1"}}, Assignments: assign("l0n1")},
		},
		"a pod outside the job holds another port": {
			pods: 1, ports: []v1.ContainerPort{port(29500, "", "")}, held: []planner.Neighbour{held("l0n0", port(29501, "", ""))},
			want: &placed{Domain: planner.Domain{Level: planner.LevelNode, Names: []string{"l0n0"}}, Assignments: assign("l0n0")},
		},
		"a pinned pod holds the port": {
			pods: 1, ports: []v1.ContainerPort{port(29500, "", "")}, pinned: "l0n0",
			want: &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n1")},
		},
		"a pod whose members ask for one port fits nowhere": {
			pods: 1, ports: []v1.ContainerPort{port(29500, "", ""), port(29500, "", "")}, clash: true,
			refused: true,
		},
		"more pods than nodes": {
			pods: 9, ports: []v1.ContainerPort{port(29500, "", "")},
			refused: true,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			job := makeJob(t, "j").Pods(tc.pods, "gpu-1").Strategy(planner.StrategyConsolidated).member("ns", "train").Obj()
			for i := range job.Pods {
				job.Pods[i].HostPorts, job.Pods[i].PortsClash = tc.ports, tc.clash
			}
			job.HostPortPods = tc.held
			if tc.pinned != "" {
				job.Placement = planner.PlacementSameLeaf
				job.Pinned = map[string]string{"old": tc.pinned}
				job.PinnedPods = map[string]planner.Pod{"old": {HostPorts: tc.ports}}
			}
			plan, err := newPlanner(t).Plan(context.Background(), planner.NewSnapshot(c, nil), nil, job)
			if tc.refused {
				var u *planner.Unschedulable
				if !errors.As(err, &u) {
					t.Fatalf("want Unschedulable, got plan %v, error %v", plan, err)
				}
				if !strings.Contains(u.Reason, "host ports") {
					t.Errorf("the refusal %q does not name the host ports", u.Reason)
				}
				return
			}
			checkPlan(t, plan, err, tc.want, nil)
		})
	}
}
