package controller

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
)

// The decision table: each case is a group as observe would see it, and
// what decide must make of it. decide reads nothing else, so these cases
// are the controller's behaviour without a cluster.

// dm is a member for the decision table. Its state is a word list:
// "gated", "bound" (to n1), "running", "bare" (no workload replaces it),
// "own" (a claim the controller allocated), "pending" (a claim not
// allocated), "planned=NODE" (gputopo.dev/node).
func dm(name string, state ...string) *member {
	p := jobPod("j", 0, "gpu-1", nil)
	p.Name = name
	p.Spec.SchedulingGates = nil
	m := &member{pod: p}
	for _, s := range state {
		switch {
		case s == "gated":
			p.Spec.SchedulingGates = []v1.PodSchedulingGate{{Name: placement.SchedulingGate}}
		case s == "bound":
			p.Spec.NodeName, m.node = "n1", "n1"
		case s == "running":
			p.Status.Phase = v1.PodRunning
		case s == "bare":
			p.OwnerReferences = nil
		case s == "own":
			cl := foreignClaim(name+"-gpus", "n1", "gpu-0")
			cl.Annotations = map[string]string{placement.AnnotationAllocatedBy: "default/job/j"}
			m.claims, m.node = append(m.claims, cl), "n1"
		case s == "pending":
			m.claims = append(m.claims, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name + "-gpus", Namespace: "default"}})
		case strings.HasPrefix(s, "planned="):
			p.Annotations[placement.AnnotationNode] = strings.TrimPrefix(s, "planned=")
		default:
			panic("unknown member state " + s)
		}
	}
	return m
}

// got is a decision in words, for comparing.
type got struct {
	Actions []string
	Next    next
	Fresh   bool
	Reason  string
	Pods    []string
	Outcome string
	Res     result
	Requeue time.Duration
	// Lists are the group's lists after the decision: toPlace, held,
	// steered, bound.
	Lists [4][]string
}

func words(d decision) got {
	kinds := map[actionKind]string{actRelease: "release", actRestart: "restart", actDelete: "delete", actNodeLost: "node-lost", actNotBound: "not-bound", actMoved: "moved"}
	var out got
	for _, a := range d.actions {
		w := kinds[a.kind] + " " + a.pod.Name
		if a.reason != "" {
			w += " " + a.reason
		}
		out.Actions = append(out.Actions, w)
	}
	out.Next, out.Fresh, out.Reason, out.Outcome, out.Res, out.Requeue = d.next, d.fresh, d.reason, d.outcome, d.res, d.requeue
	for _, p := range d.pods {
		out.Pods = append(out.Pods, p.Name)
	}
	for i, l := range [][]*member{d.g.toPlace, d.g.held, d.g.steered, d.g.bound} {
		for _, m := range l {
			out.Lists[i] = append(out.Lists[i], m.pod.Name)
		}
	}
	return out
}

func TestDecide(t *testing.T) {
	const bindTimeout = time.Minute
	foreign := func(m *member) *member {
		m.pod.Spec.SchedulingGates = append(m.pod.Spec.SchedulingGates, v1.PodSchedulingGate{Name: "kueue.x-k8s.io/admission"})
		return m
	}
	for name, tc := range map[string]struct {
		// build fills the group's lists and the members' facts.
		build func(g *group, f map[*member]facts)
		size  int
		o     func(o *observation)
		want  got
	}{
		"a deleted workload is forgotten": {
			build: func(g *group, _ map[*member]facts) { g.gone = true; g.held = []*member{dm("a", "gated", "own")} },
			want:  got{Next: nextForget, Lists: [4][]string{nil, {"a"}}},
		},
		"an index ahead of the informer waits for the claim's event": {
			build: func(g *group, _ map[*member]facts) {
				g.lagging = true
				g.toPlace = []*member{dm("a", "gated", "pending")}
			},
			want: got{Next: nextNothing, Lists: [4][]string{{"a"}}},
		},
		"an invalid request is refused on the pods that wait": {
			build: func(g *group, _ map[*member]facts) { g.toPlace = []*member{dm("a", "gated", "pending")} },
			o:     func(o *observation) { o.reqErr = errors.New("bad") },
			want:  got{Next: nextRefuse, Reason: ReasonInvalidPlacement, Outcome: OutcomeInvalid, Pods: []string{"a"}, Res: done, Lists: [4][]string{{"a"}}},
		},
		"a claim that cannot be read is refused and backs off": {
			build: func(g *group, _ map[*member]facts) {
				g.broken = errors.New("bad")
				g.toPlace = []*member{dm("a", "gated", "pending")}
			},
			want: got{Next: nextRefuse, Reason: ReasonInvalidClaim, Outcome: OutcomeInvalid, Pods: []string{"a"}, Res: backoff, Lists: [4][]string{{"a"}}},
		},
		"a clash before the gates open: the pod gives its claims back and the group is planned again": {
			build: func(g *group, f map[*member]facts) {
				m := dm("a", "gated", "own")
				g.held = []*member{m}
				f[m] = facts{clash: "device x", releasable: true}
			},
			want: got{Actions: []string{"release a " + ReleaseConflict}, Next: nextPlan, Fresh: true, Lists: [4][]string{{"a"}}},
		},
		"a clash after the gate opened: the pod that has not started is deleted for its Job to replace": {
			build: func(g *group, f map[*member]facts) {
				m, other := dm("a", "own"), dm("b", "bound", "own")
				g.steered, g.bound = []*member{m}, []*member{other}
				f[m] = facts{clash: "device x"}
			},
			want: got{Actions: []string{"delete a"}, Next: nextSettled, Lists: [4][]string{nil, nil, nil, {"b"}}},
		},
		"a clash after the gate opened: a bare pod is not deleted": {
			build: func(g *group, f map[*member]facts) {
				m := dm("a", "own", "bare")
				g.steered = []*member{m}
				f[m] = facts{clash: "device x"}
			},
			want: got{Next: nextSettled, Lists: [4][]string{nil, nil, {"a"}}},
		},
		"a clash with a bound pod that has not started: it gives way": {
			build: func(g *group, f map[*member]facts) {
				m := dm("a", "bound", "own")
				g.bound = []*member{m}
				f[m] = facts{clash: "device x"}
			},
			want: got{Actions: []string{"delete a"}, Next: nextSettled},
		},
		"a clash with a running pod: the other claim's pods that have not started give way": {
			build: func(g *group, f map[*member]facts) {
				m := dm("a", "bound", "running", "own")
				waits, runs, bare := dm("plain", "bound"), dm("other", "bound", "running"), dm("mine", "bound", "bare")
				g.bound = []*member{m}
				f[m] = facts{clash: "device x", others: []*v1.Pod{waits.pod, runs.pod, bare.pod}}
			},
			want: got{Actions: []string{"delete plain"}, Next: nextSettled, Lists: [4][]string{nil, nil, nil, {"a"}}},
		},
		"a steered pod whose node failed is planned again": {
			build: func(g *group, f map[*member]facts) {
				m, b := dm("a", "own"), dm("b", "bound", "running", "own")
				g.steered, g.bound = []*member{m}, []*member{b}
				f[m] = facts{stuck: ReleaseNodeNotReady, releasable: true}
			},
			want: got{Actions: []string{"release a " + ReleaseNodeNotReady}, Next: nextPlan, Lists: [4][]string{{"a"}, nil, nil, {"b"}}},
		},
		"a gated pod whose node failed is planned again before its gate opens": {
			build: func(g *group, f map[*member]facts) {
				m, b := dm("a", "gated", "own"), dm("b", "gated", "own")
				g.held = []*member{m, b}
				f[m] = facts{stuck: ReleaseNodeGone, releasable: true}
				f[b] = facts{releasable: true}
			},
			want: got{Actions: []string{"release a " + ReleaseNodeGone, "restart b"}, Next: nextPlan, Fresh: true, Lists: [4][]string{{"a", "b"}}},
		},
		"a steered pod the scheduler owns now is looked at again after the bind timeout": {
			build: func(g *group, f map[*member]facts) {
				m := dm("a", "own")
				g.steered = []*member{m}
				f[m] = facts{stuck: ReleaseTimeout}
			},
			want: got{Actions: []string{"not-bound a " + ReleaseTimeout}, Next: nextSettled, Requeue: bindTimeout, Lists: [4][]string{nil, nil, {"a"}}},
		},
		"a bound pod of a deleted node pins nothing and is left to the pod garbage collector": {
			build: func(g *group, f map[*member]facts) {
				m := dm("a", "bound", "running", "own")
				g.bound = []*member{m}
				f[m] = facts{nodeGone: true}
			},
			want: got{Actions: []string{"node-lost a"}, Next: nextSettled},
		},
		"a pod the scheduler bound elsewhere in its domain is recorded": {
			build: func(g *group, _ map[*member]facts) { g.bound = []*member{dm("a", "bound", "own", "planned=n9")} },
			want:  got{Actions: []string{"moved a"}, Next: nextSettled, Lists: [4][]string{nil, nil, nil, {"a"}}},
		},
		"a pod another gate holds gives back what it holds and the group waits for the gates": {
			build: func(g *group, _ map[*member]facts) { g.foreign = []*member{foreign(dm("a", "gated", "own"))} },
			want:  got{Actions: []string{"release a " + ReleaseForeignGate}, Next: nextStatus, Reason: placement.StatusWaitingForGates, Pods: []string{"a"}},
		},
		"a placed group whose claims are seen opens its gates": {
			build: func(g *group, _ map[*member]facts) { g.held = []*member{dm("a", "gated", "own")} },
			want:  got{Next: nextOpenGates, Lists: [4][]string{nil, {"a"}}},
		},
		"a placed group waits for the index to show its claims": {
			build: func(g *group, _ map[*member]facts) { g.held = []*member{dm("a", "gated", "own")} },
			o:     func(o *observation) { o.unseen = "default/a-gpus" },
			want:  got{Next: nextNothing, Lists: [4][]string{nil, {"a"}}},
		},
		"a placed group whose gates were opened but not seen yet waits for the informer, though a new pod asks for a place": {
			size: 2,
			build: func(g *group, _ map[*member]facts) {
				g.held = []*member{dm("a", "gated", "own")}
				g.toPlace = []*member{dm("b", "gated", "pending")}
			},
			o:    func(o *observation) { o.unseen = "pod default/a" },
			want: got{Next: nextNothing, Lists: [4][]string{{"b"}, {"a"}}},
		},
		"a placed group waits out a settle delay when one is set": {
			build: func(g *group, _ map[*member]facts) { g.held = []*member{dm("a", "gated", "own")} },
			o:     func(o *observation) { o.gatesIn = time.Second },
			want:  got{Next: nextWaitGates, Lists: [4][]string{nil, {"a"}}},
		},
		"a group whose claims are not all created waits, saying so": {
			build: func(g *group, _ map[*member]facts) {
				g.held = []*member{dm("a", "gated", "own")}
				g.waiting = []*member{dm("b", "gated")}
			},
			want: got{Next: nextStatus, Reason: placement.StatusWaitingForPods, Pods: []string{"b"}, Lists: [4][]string{nil, {"a"}}},
		},
		"a fresh group waits for all its pods": {
			size: 3,
			build: func(g *group, _ map[*member]facts) {
				g.toPlace = []*member{dm("a", "gated", "pending"), dm("b", "gated", "pending")}
			},
			want: got{Next: nextStatus, Fresh: true, Reason: placement.StatusWaitingForPods, Outcome: OutcomeWaiting, Pods: []string{"a", "b"}, Lists: [4][]string{{"a", "b"}}},
		},
		"a fresh group with a pod its volumes keep off every node waits, saying so, holding nothing": {
			size: 2,
			build: func(g *group, _ map[*member]facts) {
				a, b := dm("a", "gated", "own"), dm("b", "gated", "pending")
				b.volumeWait = "PersistentVolumeClaim data does not exist; create it"
				g.held, g.toPlace = []*member{a}, []*member{b}
			},
			want: got{Actions: []string{"restart a"}, Next: nextStatus, Fresh: true, Reason: placement.StatusWaitingForVolumes, Outcome: OutcomeWaiting, Pods: []string{"a", "b"}, Lists: [4][]string{{"a", "b"}}},
		},
		"a replacement pod whose volumes can go somewhere is planned": {
			build: func(g *group, _ map[*member]facts) {
				a, b := dm("a", "bound", "running", "own"), dm("b", "gated", "pending")
				b.volumes = []*v1.NodeSelector{nodeNamed("n1")}
				g.bound, g.toPlace = []*member{a}, []*member{b}
			},
			want: got{Next: nextPlan, Lists: [4][]string{{"b"}, nil, nil, {"a"}}},
		},
		"a replacement pod waits for its volumes; the pods that run keep their places": {
			build: func(g *group, _ map[*member]facts) {
				a, b := dm("a", "bound", "running", "own"), dm("b", "gated", "pending")
				b.volumeWait = "PersistentVolumeClaim data is being deleted"
				g.bound, g.toPlace = []*member{a}, []*member{b}
			},
			want: got{Next: nextStatus, Reason: placement.StatusWaitingForVolumes, Outcome: OutcomeWaiting, Pods: []string{"b"}, Lists: [4][]string{{"b"}, nil, nil, {"a"}}},
		},
		// JobSet's exclusive placement: the followers are created only
		// once their leader is scheduled, so the leaders are planned.
		"a fresh group whose missing pods come after its leaders is planned": {
			size: 4,
			build: func(g *group, _ map[*member]facts) {
				g.toPlace = []*member{dm("a", "gated", "pending"), dm("b", "gated", "pending")}
				g.exclusive, g.due = true, []followersDue{{leader: g.toPlace[0].pod, n: 1}, {leader: g.toPlace[1].pod, n: 1}}
			},
			want: got{Next: nextPlan, Fresh: true, Lists: [4][]string{{"a", "b"}}},
		},
		"... and waits for a leader that is not there yet": {
			size: 4,
			build: func(g *group, _ map[*member]facts) {
				g.toPlace = []*member{dm("a", "gated", "pending")}
				g.exclusive, g.due = true, []followersDue{{leader: g.toPlace[0].pod, n: 1}}
			},
			want: got{Next: nextStatus, Fresh: true, Reason: placement.StatusWaitingForPods, Outcome: OutcomeWaiting, Pods: []string{"a"}, Lists: [4][]string{{"a"}}},
		},
		"a fresh group with a pod another gate holds waits for the gates, holding nothing": {
			build: func(g *group, _ map[*member]facts) {
				g.toPlace = []*member{dm("a", "gated", "pending")}
				g.foreign = []*member{foreign(dm("b", "gated", "pending"))}
			},
			size: 2,
			want: got{Next: nextStatus, Fresh: true, Reason: placement.StatusWaitingForGates, Outcome: OutcomeWaiting, Pods: []string{"b", "a"}, Lists: [4][]string{{"a"}}},
		},
		"a half-written fresh group takes its claims back and is planned as a whole": {
			size: 3,
			build: func(g *group, _ map[*member]facts) {
				g.held = []*member{dm("a", "gated", "own")}
				g.toPlace = []*member{dm("b", "gated", "pending"), dm("c", "gated", "own", "pending")}
			},
			want: got{Actions: []string{"restart a", "restart c"}, Next: nextPlan, Fresh: true, Lists: [4][]string{{"a", "b", "c"}}},
		},
		"a group with a running pod plans its new pods around it": {
			size: 2,
			build: func(g *group, _ map[*member]facts) {
				g.bound = []*member{dm("a", "bound", "running", "own")}
				g.toPlace = []*member{dm("b", "gated", "pending")}
			},
			want: got{Next: nextPlan, Lists: [4][]string{{"b"}, nil, nil, {"a"}}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			g := &group{key: "default/job/j", ns: "default", size: max(tc.size, 1)}
			f := map[*member]facts{}
			tc.build(g, f)
			if tc.size == 0 {
				g.size = g.members()
			}
			o := &observation{g: g, facts: f}
			if tc.o != nil {
				tc.o(o)
			}
			before := fmt.Sprint(g.toPlace, g.held, g.steered, g.bound)
			d := decide(o, bindTimeout)
			if diff := cmp.Diff(tc.want, words(d)); diff != "" {
				t.Errorf("decision (-want +got):\n%s", diff)
			}
			if after := fmt.Sprint(g.toPlace, g.held, g.steered, g.bound); after != before {
				t.Errorf("decide changed the observed group: %s, was %s", after, before)
			}
		})
	}
}

func TestUnpinMovesOnlyWhatMayMove(t *testing.T) {
	free, taken, waits := dm("a", "gated", "own"), dm("b", "gated", "own"), dm("c", "gated", "pending")
	g := &group{key: "default/job/j", held: []*member{free, taken}, toPlace: []*member{waits}}
	o := &observation{g: g, facts: map[*member]facts{free: {releasable: true}}}
	acts, moved := unpin(o, g)
	var gotActs []string
	for _, a := range acts {
		gotActs = append(gotActs, a.pod.Name+" "+a.reason)
	}
	if want := []string{"a " + ReleaseDomainFull}; !cmp.Equal(gotActs, want) {
		t.Errorf("actions %v, want %v", gotActs, want)
	}
	if got := words(decision{g: moved}).Lists; !cmp.Equal(got, [4][]string{{"a", "c"}, {"b"}}) {
		t.Errorf("lists after unpin %v", got)
	}
	if len(g.held) != 2 {
		t.Error("unpin changed the group it was given")
	}
	if acts, _ := unpin(&observation{facts: map[*member]facts{}}, g); acts != nil {
		t.Errorf("nothing may move, yet unpin moved %v", acts)
	}
}
