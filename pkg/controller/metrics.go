package controller

import (
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the controller's collectors, registered on an injected
// registry.
type Metrics struct {
	Decisions       *prometheus.CounterVec
	PlanDuration    *prometheus.HistogramVec
	TreeDuration    *prometheus.HistogramVec
	PendingGroups   prometheus.Gauge
	WritingGroups   prometheus.Gauge
	LeafUtilization *prometheus.GaugeVec
	Fragmentation   prometheus.Gauge
	LeafFragment    prometheus.Gauge
	Released        *prometheus.CounterVec
	Conflicts       prometheus.Counter
	Fences          prometheus.Counter
}

// Decision outcomes.
const (
	OutcomePlaced        = "placed"
	OutcomeUnschedulable = "unschedulable"
	OutcomeInvalid       = "invalid"
	OutcomeWaiting       = "waiting"
	// OutcomeReservationExpired counts reservations that ended unplaced.
	OutcomeReservationExpired = "reservation-expired"
)

// Label values of plan_duration_seconds{pods}: the group's size, in
// buckets, so the plans of big gangs are seen apart from one-pod plans.
const (
	PodsOne     = "1"
	PodsTwoFour = "2-4"
	PodsToEight = "5-8"
	PodsTo16    = "9-16"
	PodsMore    = "17+"
)

// PodsBucket is the plan_duration_seconds label value for a group of n pods.
func PodsBucket(n int) string {
	switch {
	case n <= 1:
		return PodsOne
	case n <= 4:
		return PodsTwoFour
	case n <= 8:
		return PodsToEight
	case n <= 16:
		return PodsTo16
	}
	return PodsMore
}

// Label values of tree_update_duration_seconds{kind}.
const (
	// TreeBuild: the tree built from every node (the first plan, a new
	// label mapping, a change a patch cannot make).
	TreeBuild = "build"
	// TreePatch: the nodes that changed since the last plan patched in,
	// added or removed.
	TreePatch = "patch"
)

// NewMetrics creates the collectors and registers them on reg (nil skips
// registration).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gputopo", Subsystem: "controller", Name: "decisions_total",
			Help: "Placement decisions for pod groups, by outcome (placed, unschedulable, invalid, waiting).",
		}, []string{"outcome"}),
		PlanDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "gputopo", Subsystem: "controller", Name: "plan_duration_seconds",
			Help: "Time to plan one pod group, by the group's size (pods: " + PodsOne + ", " + PodsTwoFour + ", " + PodsToEight + ", " + PodsTo16 + ", " + PodsMore + "), from the start of its sync: reading the group and its claims, the snapshot, and the plan with the structured allocator. Updating the tree (tree_update_duration_seconds) and the plan's claim writes are not included.", Buckets: PlanBuckets(),
		}, []string{"pods"}),
		TreeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "gputopo", Subsystem: "controller", Name: "tree_update_duration_seconds",
			Help: "Time to bring the topology tree up to date before a plan, by kind: " + TreeBuild + " (from every node) or " + TreePatch + " (the nodes that changed).", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18),
		}, []string{"kind"}),
		PendingGroups: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "gputopo", Subsystem: "controller", Name: "pending_groups",
			Help: "Pod groups with gated pods that are not placed yet.",
		}),
		WritingGroups: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "gputopo", Subsystem: "controller", Name: "writing_groups",
			Help: "Pod groups whose writes (claim allocations, gates, or what waiting pods wait for) are in flight beside the planning worker; when the allocations and gates reach --concurrent-group-writes the worker waits for one to end.",
		}),
		LeafUtilization: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "gputopo", Subsystem: "controller", Name: "leaf_gpu_utilization",
			Help: "Fraction of a leaf's GPUs that are allocated or reserved.",
		}, []string{"spine", "leaf"}),
		Fragmentation: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "gputopo", Subsystem: "controller", Name: "fragmentation_ratio",
			Help: "Fraction of free GPUs on nodes that are partly used, which a whole-node pod cannot use.",
		}),
		LeafFragment: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "gputopo", Subsystem: "controller", Name: "leaf_fragmentation_ratio",
			Help: "Fraction of completely free nodes that sit in leaves that are partly used.",
		}),
		Released: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gputopo", Subsystem: "controller", Name: "released_pods_total",
			Help: "Pods whose claims were taken back and planned again, by reason (NodeDeleted, NodeNotReady, NodeTainted, Unschedulable, DeviceConflict), or that the scheduler moved within their domain (Moved).",
		}, []string{"reason"}),
		Conflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "gputopo", Subsystem: "controller", Name: "device_conflicts_total",
			Help: "Claims of placed groups found sharing a device with another claim.",
		}),
		Fences: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "gputopo", Subsystem: "controller", Name: "device_fences_total",
			Help: "DeviceTaintRules written on a device kube-scheduler no longer counted as allocated though a claim held it (two claims held it and one gave it back).",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.Decisions, m.PlanDuration, m.TreeDuration, m.PendingGroups, m.WritingGroups, m.LeafUtilization, m.Fragmentation, m.LeafFragment, m.Released, m.Conflicts, m.Fences)
	}
	return m
}

// PlanGoal is the plan time the benchmarks hold plans to
// (docs/benchmarks.md): plan_duration_seconds has a bucket bound there,
// so the plans above it are counted exactly rather than estimated inside
// a wider bucket.
const PlanGoal = 50 * time.Millisecond

// PlanBuckets are plan_duration_seconds' bounds: 0.5 ms doubling to 16 s,
// and PlanGoal.
func PlanBuckets() []float64 {
	b := prometheus.ExponentialBuckets(0.0005, 2, 16)
	i, _ := slices.BinarySearch(b, PlanGoal.Seconds())
	return slices.Insert(b, i, PlanGoal.Seconds())
}
