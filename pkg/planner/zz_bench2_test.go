package planner_test
import ("context";"testing";"errors"
"github.com/gputopo/gputopo/pkg/planner")
func BenchmarkZZPcie(b *testing.B) {
	infos := makeCluster().Spines(10, 50, 8, "hgx-pcie-pairs").Infos(benchTB{})
	c, _ := planner.NewCluster(infos, nil)
	_, used := bigCluster()
	snap := planner.NewSnapshot(c, used)
	p := newPlanner(b)
	job := makeJob(b, "j").Pods(16, "gpu-4-nvlink").Obj()
	for b.Loop() {
		_, err := p.Plan(context.Background(), snap, nil, job)
		var u *planner.Unschedulable
		if !errors.As(err, &u) { b.Fatal(err) }
	}
	_, err := p.Plan(context.Background(), snap, nil, job)
	b.Log(err)
	job = makeJob(b, "j").Pods(16, "gpu-4-leaf").Obj()
	for range 3 { _, err = p.Plan(context.Background(), snap, nil, job) }
	b.Log(err)
}
