package scale

import (
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const schedulerText = `# TYPE scheduler_schedule_attempts_total counter
scheduler_schedule_attempts_total{profile="default-scheduler",result="scheduled"} 90
scheduler_schedule_attempts_total{profile="default-scheduler",result="unschedulable"} 10
scheduler_schedule_attempts_total{profile="other",result="scheduled"} 5
# TYPE scheduler_framework_extension_point_duration_seconds histogram
scheduler_framework_extension_point_duration_seconds_bucket{extension_point="Filter",profile="default-scheduler",status="Success",le="0.001"} 10
scheduler_framework_extension_point_duration_seconds_bucket{extension_point="Filter",profile="default-scheduler",status="Success",le="0.01"} 90
scheduler_framework_extension_point_duration_seconds_bucket{extension_point="Filter",profile="default-scheduler",status="Success",le="0.1"} 100
scheduler_framework_extension_point_duration_seconds_bucket{extension_point="Filter",profile="default-scheduler",status="Success",le="+Inf"} 100
scheduler_framework_extension_point_duration_seconds_sum{extension_point="Filter",profile="default-scheduler",status="Success"} 0.6
scheduler_framework_extension_point_duration_seconds_count{extension_point="Filter",profile="default-scheduler",status="Success"} 100
scheduler_framework_extension_point_duration_seconds_bucket{extension_point="Filter",profile="default-scheduler",status="Unschedulable",le="0.001"} 0
scheduler_framework_extension_point_duration_seconds_bucket{extension_point="Filter",profile="default-scheduler",status="Unschedulable",le="0.01"} 0
scheduler_framework_extension_point_duration_seconds_bucket{extension_point="Filter",profile="default-scheduler",status="Unschedulable",le="0.1"} 20
scheduler_framework_extension_point_duration_seconds_bucket{extension_point="Filter",profile="default-scheduler",status="Unschedulable",le="+Inf"} 20
scheduler_framework_extension_point_duration_seconds_sum{extension_point="Filter",profile="default-scheduler",status="Unschedulable"} 1.0
scheduler_framework_extension_point_duration_seconds_count{extension_point="Filter",profile="default-scheduler",status="Unschedulable"} 20
scheduler_framework_extension_point_duration_seconds_bucket{extension_point="Score",profile="default-scheduler",status="Success",le="0.001"} 4
scheduler_framework_extension_point_duration_seconds_bucket{extension_point="Score",profile="default-scheduler",status="Success",le="0.01"} 4
scheduler_framework_extension_point_duration_seconds_bucket{extension_point="Score",profile="default-scheduler",status="Success",le="0.1"} 4
scheduler_framework_extension_point_duration_seconds_bucket{extension_point="Score",profile="default-scheduler",status="Success",le="+Inf"} 4
scheduler_framework_extension_point_duration_seconds_sum{extension_point="Score",profile="default-scheduler",status="Success"} 0.002
scheduler_framework_extension_point_duration_seconds_count{extension_point="Score",profile="default-scheduler",status="Success"} 4
`

func parse(t *testing.T, text string) Metrics {
	t.Helper()
	m, err := ParseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestSumBy(t *testing.T) {
	m := parse(t, schedulerText)
	got := m.SumBy("scheduler_schedule_attempts_total", map[string]string{"profile": "default-scheduler"}, "result")
	if diff := cmp.Diff(map[string]float64{"scheduled": 90, "unschedulable": 10}, got); diff != "" {
		t.Errorf("SumBy (-want +got):\n%s", diff)
	}
	if got := m.Sum("scheduler_schedule_attempts_total", nil); got != 105 {
		t.Errorf("Sum of every series = %v, want 105", got)
	}
	if got := m.Sum("no_such_metric", nil); got != 0 {
		t.Errorf("Sum of a missing family = %v, want 0", got)
	}
}

func TestHistogramByMergesSeries(t *testing.T) {
	m := parse(t, schedulerText)
	got := m.HistogramBy("scheduler_framework_extension_point_duration_seconds", nil, "extension_point")
	want := map[string]Hist{
		// Success and Unschedulable merged: 120 observations, 1.6 s.
		"Filter": {Count: 120, Sum: 1.6, Bounds: []float64{0.001, 0.01, 0.1, math.Inf(1)}, Buckets: []float64{10, 90, 120, 120}},
		"Score":  {Count: 4, Sum: 0.002, Bounds: []float64{0.001, 0.01, 0.1, math.Inf(1)}, Buckets: []float64{4, 4, 4, 4}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("HistogramBy (-want +got):\n%s", diff)
	}
}

func TestHistQuantileAndSub(t *testing.T) {
	h := Hist{Count: 100, Sum: 2, Bounds: []float64{0.01, 0.02, 0.04, math.Inf(1)}, Buckets: []float64{50, 90, 99, 100}}
	for _, tc := range []struct {
		q, want float64
	}{
		{0.25, 0.005}, // halfway into the first bucket, from 0
		{0.5, 0.01},   // its upper bound
		{0.7, 0.015},  // halfway into (0.01, 0.02]
		{0.99, 0.04},  // the top of (0.02, 0.04]
		{0.995, 0.04}, // in +Inf: the largest finite bound
	} {
		if got := h.Quantile(tc.q); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("Quantile(%v) = %v, want %v", tc.q, got, tc.want)
		}
	}
	earlier := Hist{Count: 50, Sum: 0.5, Bounds: h.Bounds, Buckets: []float64{50, 50, 50, 50}}
	d := h.Sub(earlier)
	if diff := cmp.Diff(Hist{Count: 50, Sum: 1.5, Bounds: h.Bounds, Buckets: []float64{0, 40, 49, 50}}, d); diff != "" {
		t.Errorf("Sub (-want +got):\n%s", diff)
	}
	if got := d.Quantile(0.5); math.Abs(got-0.01625) > 1e-9 {
		// rank 25 of 50: 25 of the 40 in (0.01, 0.02].
		t.Errorf("Quantile(0.5) of the difference = %v, want 0.01625", got)
	}
	if got := d.Mean(); got != 0.03 {
		t.Errorf("Mean = %v, want 0.03", got)
	}
	if !math.IsNaN((Hist{}).Quantile(0.5)) {
		t.Error("Quantile of an empty histogram is a number, want NaN")
	}
	// A series absent from the earlier scrape counts from zero.
	if diff := cmp.Diff(h, h.Sub(Hist{})); diff != "" {
		t.Errorf("Sub(empty) changed the histogram (-want +got):\n%s", diff)
	}
}

func TestHistDeltaPerSeries(t *testing.T) {
	before := parse(t, `# TYPE gputopo_controller_plan_duration_seconds histogram
gputopo_controller_plan_duration_seconds_bucket{le="0.01"} 1
gputopo_controller_plan_duration_seconds_bucket{le="0.05"} 1
gputopo_controller_plan_duration_seconds_bucket{le="+Inf"} 2
gputopo_controller_plan_duration_seconds_sum 0.105
gputopo_controller_plan_duration_seconds_count 2
`)
	// Four plans under 10 ms and two over the 50 ms goal since then.
	after := parse(t, `# TYPE gputopo_controller_plan_duration_seconds histogram
gputopo_controller_plan_duration_seconds_bucket{le="0.01"} 5
gputopo_controller_plan_duration_seconds_bucket{le="0.05"} 5
gputopo_controller_plan_duration_seconds_bucket{le="+Inf"} 8
gputopo_controller_plan_duration_seconds_sum 0.325
gputopo_controller_plan_duration_seconds_count 8
# TYPE gputopo_controller_sync_duration_seconds histogram
gputopo_controller_sync_duration_seconds_bucket{kind="job",le="0.01"} 2
gputopo_controller_sync_duration_seconds_bucket{kind="job",le="+Inf"} 2
gputopo_controller_sync_duration_seconds_sum{kind="job"} 0.01
gputopo_controller_sync_duration_seconds_count{kind="job"} 2
# TYPE other_seconds histogram
other_seconds_bucket{le="+Inf"} 2
other_seconds_sum 1
other_seconds_count 2
`)
	got := histDelta(before, after, "gputopo_controller_")
	want := []HistSummary{
		{Name: "gputopo_controller_plan_duration_seconds", Count: 6, Mean: 0.22 / 6, P50: 0.0075, P90: 0.05, P99: 0.05, OverGoal: 2},
		// No bucket bound at the goal: nothing counted.
		{Name: "gputopo_controller_sync_duration_seconds", Labels: `kind="job"`, Count: 2, Mean: 0.005, P50: 0.005, P90: 0.009, P99: 0.0099, OverGoal: -1},
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b float64) bool { return math.Abs(a-b) < 1e-9 })); diff != "" {
		t.Errorf("histDelta (-want +got):\n%s", diff)
	}
}

func TestWriteDelta(t *testing.T) {
	before := parse(t, `# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",resource="pods",subresource="",verb="POST"} 10
apiserver_request_total{code="200",component="apiserver",resource="pods",subresource="",verb="LIST"} 3
`)
	after := parse(t, `# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",resource="pods",subresource="",verb="POST"} 30
apiserver_request_total{code="409",component="apiserver",resource="pods",subresource="",verb="POST"} 2
apiserver_request_total{code="201",component="apiserver",resource="pods",subresource="binding",verb="POST"} 20
apiserver_request_total{code="200",component="apiserver",resource="pods",subresource="",verb="PATCH"} 7
apiserver_request_total{code="200",component="apiserver",resource="pods",subresource="",verb="LIST"} 9
`)
	want := map[string]float64{"POST pods": 22, "POST pods/binding": 20, "PATCH pods": 7}
	if diff := cmp.Diff(want, writeDelta(before, after)); diff != "" {
		t.Errorf("writeDelta (-want +got):\n%s", diff)
	}
}
