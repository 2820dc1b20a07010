package simulate_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/gputopo/gputopo/pkg/simulate"
)

// BenchmarkAlibabaDefault replays the first 1,500 GPU pods of the Alibaba
// default trace, in trace order, on the full 1,213-node cluster through
// both schedulers. It needs ../shared/data beside the repository.
func BenchmarkAlibabaDefault(b *testing.B) {
	data := sharedData(b)
	if data == "" {
		b.Skip("no ../shared/data/alibaba-gpu-v2023 beside the repository")
	}
	dir := filepath.Join(data, "alibaba-gpu-v2023")
	c, err := simulate.LoadCluster(filepath.Join(dir, "openb_node_list_gpu_node.csv"), simulate.DefaultGrouping(), simulate.ClusterOptions{Sharing: true})
	if err != nil {
		b.Fatal(err)
	}
	tr, err := simulate.LoadTrace(filepath.Join(dir, "openb_pod_list_default.csv"), "")
	if err != nil {
		b.Fatal(err)
	}
	tr.Jobs = tr.Jobs[:1500]
	b.ResetTimer()
	for b.Loop() {
		res, err := simulate.Run(context.Background(), c, demoClaims(b), simulate.Fixed(tr), simulate.Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(res.PlanLatencyP99Ms, "p99-ms/plan")
		b.ReportMetric(res.Metrics.ReplaySeconds*1e3/float64(res.Jobs), "ms/plan")
		b.ReportMetric(res.Baseline.ReplaySeconds*1e3/float64(res.Jobs), "baseline-ms/pod")
	}
}

// TestAlibabaNodeList loads the real node list: opt-in, it needs
// ../shared/data and is skipped with -short.
func TestAlibabaNodeList(t *testing.T) {
	data := sharedData(t)
	if data == "" || testing.Short() {
		t.Skip("needs ../shared/data/alibaba-gpu-v2023 beside the repository, and no -short")
	}
	c, err := simulate.LoadCluster(filepath.Join(data, "alibaba-gpu-v2023", "openb_node_list_gpu_node.csv"), simulate.DefaultGrouping(), simulate.ClusterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Nodes) != 1213 || c.GPUs != 6212 || c.Leaves != 76 || c.Spines != 10 {
		t.Errorf("%d nodes, %d GPUs, %d leaves, %d spines; want 1213, 6212, 76, 10", len(c.Nodes), c.GPUs, c.Leaves, c.Spines)
	}
}
