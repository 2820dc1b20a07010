package controller

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// The plan histogram counts the plans over the goal exactly: a plan just
// under it and one just over it fall on either side of a bucket bound.
func TestPlanHistogramBoundsTheGoal(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	under, over := PlanGoal.Seconds()*0.98, PlanGoal.Seconds()*1.02
	m.PlanDuration.WithLabelValues(PodsOne).Observe(under)
	m.PlanDuration.WithLabelValues(PodsOne).Observe(over)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "gputopo_controller_plan_duration_seconds" {
			continue
		}
		h := f.GetMetric()[0].GetHistogram()
		for _, b := range h.GetBucket() {
			if b.GetUpperBound() == PlanGoal.Seconds() {
				if b.GetCumulativeCount() != 1 {
					t.Errorf("plans at or under %s = %d, want 1 (of %d)", PlanGoal, b.GetCumulativeCount(), h.GetSampleCount())
				}
				return
			}
		}
		t.Fatalf("plan_duration_seconds has no bucket bound at the %s goal: %v", PlanGoal, PlanBuckets())
	}
	t.Fatalf("plan_duration_seconds not registered")
}
