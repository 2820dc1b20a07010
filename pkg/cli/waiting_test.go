package cli_test

import (
	"encoding/xml"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
	"github.com/gputopo/gputopo/pkg/cli"
)

func gatedPod(ns, name, job string, created time.Time, ann map[string]string) v1.Pod {
	p := v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, CreationTimestamp: metav1.NewTime(created), Annotations: ann,
		Labels: map[string]string{"batch.kubernetes.io/job-name": job}}}
	p.Spec.SchedulingGates = []v1.PodSchedulingGate{{Name: placement.SchedulingGate}}
	return p
}

// The fixture with two waiting groups: ml/big, which holds the
// reservation of a2 in leaf-0, and ml/late, whose reservation ran out; a
// running pod and a pod held only by another gate are not waiting for
// gputopo.
func waitingFixture(t *testing.T, now time.Time) (fixture, []cli.WaitingGroup) {
	f := newFixture(t)
	res := placement.Reservation{Until: now.Add(4 * time.Minute).Truncate(time.Second), Domain: placement.Domain{Level: placement.LevelLeaf, Names: []string{"leaf-0"}}, Nodes: []string{"a2"}}
	old := placement.Reservation{Until: now.Add(-time.Second).Truncate(time.Second), Domain: res.Domain, Nodes: []string{"a1"}}
	status := placement.Status{Reason: placement.StatusUnschedulable, Message: "no leaf can hold 2 pods"}.Format()
	other := gatedPod("ml", "queued-0", "queued", now, nil)
	other.Spec.SchedulingGates = []v1.PodSchedulingGate{{Name: "example.com/queue"}}
	f.pods = append(f.pods,
		gatedPod("ml", "late-0", "late", now.Add(-time.Minute), map[string]string{placement.AnnotationReservation: old.Format()}),
		gatedPod("ml", "big-1", "big", now.Add(-9*time.Minute), map[string]string{placement.AnnotationStatus: status, placement.AnnotationReservation: res.Format()}),
		gatedPod("ml", "big-0", "big", now.Add(-10*time.Minute), map[string]string{placement.AnnotationStatus: status, placement.AnnotationReservation: res.Format()}),
		other)
	return f, cli.BuildWaiting(f.pods, now)
}

func TestBuildWaiting(t *testing.T) {
	now := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	_, got := waitingFixture(t, now)
	want := []cli.WaitingGroup{
		{Group: "ml/big", Pods: 2, Since: now.Add(-10 * time.Minute), Reason: placement.StatusUnschedulable, Message: "no leaf can hold 2 pods",
			Reservation: &cli.ReservationView{Domain: "leaf leaf-0", Nodes: []string{"a2"}, Until: now.Add(4 * time.Minute)}},
		{Group: "ml/late", Pods: 1, Since: now.Add(-time.Minute)},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestViewsShowWaitingGroupsAndReservations(t *testing.T) {
	now := time.Now()
	f, waiting := waitingFixture(t, now)
	views := f.views()
	cli.MarkReserved(views, waiting)
	var tree strings.Builder
	if err := cli.RenderTree(&tree, views, cli.TreeOptions{Waiting: waiting}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{
		"│   └── a2 hgx-pcie-pairs     8/8 free  [□□] [□□] [□□] [□□]  reserved for ml/big\n",
		"waiting: 2 groups\n",
		"├── ml/big   2 pods  Unschedulable: no leaf can hold 2 pods  reserved a2 in leaf leaf-0 until ",
		"└── ml/late  1 pod\n",
	} {
		if !strings.Contains(tree.String(), s) {
			t.Errorf("tree lacks %q:\n%s", s, tree.String())
		}
	}
	if strings.Contains(tree.String(), "a1 dgx1-v100          4/8 free  [□□□□ ■■■■]  reserved") {
		t.Errorf("a1's reservation ran out, but the tree still shows it:\n%s", tree.String())
	}

	var svg strings.Builder
	if err := cli.RenderSVG(&svg, views, waiting); err != nil {
		t.Fatal(err)
	}
	if err := wellFormed(svg.String()); err != nil {
		t.Fatalf("the SVG is not well-formed XML: %v", err)
	}
	for _, s := range []string{`class="reserved"/>`, ">reserved for ml/big</text>", ">waiting: 2 groups</text>", ">ml/big · 2 pods · Unschedulable: no leaf can hold 2 pods · reserved a2 in leaf leaf-0 until "} {
		if !strings.Contains(svg.String(), s) {
			t.Errorf("SVG lacks %q", s)
		}
	}
	if n := strings.Count(svg.String(), `class="reserved"`); n != 1 {
		t.Errorf("%d reserved node frames, want 1 (a2)", n)
	}
}

func wellFormed(s string) error {
	d := xml.NewDecoder(strings.NewReader(s))
	for {
		if _, err := d.Token(); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
	}
}
