package simulate_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gputopo/gputopo/pkg/simulate"
)

// The FGD artifact's cluster is the nodes with GPUs: GPUNodesOnly drops
// the others before nodes are grouped into leaves, and every GPU node
// carries its model as a label.
func TestGPUNodesOnly(t *testing.T) {
	in := "sn,cpu_milli,memory_mib,gpu,model\n" +
		"n0,64000,262144,2,P100\n" +
		"n1,64000,262144,0,\n" +
		"n2,96000,786432,8,G2\n" +
		"n3,96000,786432,0,\n" +
		"n4,96000,786432,8,T4\n"
	type row struct{ Name, Leaf, Model string }
	rows := func(specs []simulate.NodeSpec) []row {
		var out []row
		for _, s := range specs {
			out = append(out, row{s.Name, s.Leaf, s.Labels[simulate.LabelGPUModel]})
		}
		return out
	}
	all, err := simulate.ParseAlibabaNodes(strings.NewReader(in), "nodes.csv", simulate.Grouping{NodesPerLeaf: 2, LeavesPerSpine: 4})
	if err != nil {
		t.Fatal(err)
	}
	gpu, err := simulate.ParseAlibabaNodes(strings.NewReader(in), "nodes.csv", simulate.Grouping{NodesPerLeaf: 2, LeavesPerSpine: 4, GPUNodesOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	wantAll := []row{{"n0", "leaf-0", "P100"}, {"n1", "leaf-0", ""}, {"n2", "leaf-1", "G2"}, {"n3", "leaf-1", ""}, {"n4", "leaf-2", "T4"}}
	wantGPU := []row{{"n0", "leaf-0", "P100"}, {"n2", "leaf-0", "G2"}, {"n4", "leaf-1", "T4"}}
	if diff := cmp.Diff(wantAll, rows(all)); diff != "" {
		t.Errorf("every node (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantGPU, rows(gpu)); diff != "" {
		t.Errorf("GPU nodes only (-want +got):\n%s", diff)
	}
	c, err := simulate.NewCluster(gpu, simulate.ClusterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Nodes[1].Obj.Labels[simulate.LabelGPUModel]; got != "G2" {
		t.Errorf("node n2's model label = %q, want G2", got)
	}
}

// gpu_spec lists the models a pod may use; empty fields and repeats
// drop out.
func TestParseGPUSpec(t *testing.T) {
	in := alibabaHeader +
		"p0,1000,1024,1,1000,T4,LS,Running,0,1,0\n" +
		"p1,1000,1024,2,1000,P100|V100M16||P100,LS,Running,0,1,0\n" +
		"p2,1000,1024,1,500,,LS,Running,0,1,0\n"
	tr, err := simulate.ParseAlibabaPods(strings.NewReader(in), "pods.csv")
	if err != nil {
		t.Fatal(err)
	}
	var got [][]string
	for _, j := range tr.Jobs {
		got = append(got, j.GPUModels)
	}
	if diff := cmp.Diff([][]string{{"T4"}, {"P100", "V100M16"}, nil}, got); diff != "" {
		t.Errorf("GPU models (-want +got):\n%s", diff)
	}
	if tr.ModelPods != 2 {
		t.Errorf("ModelPods = %d, want 2", tr.ModelPods)
	}
}

// With GPUModels every scheduler puts a pod only on a node of a model
// its gpu_spec names, and refuses it when those are full; without, the
// models are ignored.
func TestGPUModelsEnforced(t *testing.T) {
	nodes := "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\nn1,64000,262144,2,T4\nn2,64000,262144,2,G2\n"
	// Three pods of one GPU that must run on T4, two that may run on
	// T4 or G2: five for the four GPUs they may use.
	pods := alibabaHeader +
		"a0,1000,1024,1,1000,T4,,,,,\n" +
		"a1,1000,1024,1,1000,T4,,,,,\n" +
		"a2,1000,1024,1,1000,T4,,,,,\n" +
		"b0,1000,1024,1,1000,T4|G2,,,,,\n" +
		"b1,1000,1024,1,1000,T4|G2,,,,,\n"
	c, tr := alibabaInput(t, nodes, pods)
	for _, enforce := range []bool{true, false} {
		res := run(t, c, tr, simulate.Options{GPUModels: enforce, FGDWorkload: enforce})
		for _, m := range each(res) {
			want := 5
			if enforce {
				want = 4
			}
			if m.Placed != want {
				t.Errorf("GPUModels %v, %s: %d of 5 placed, want %d", enforce, m.Scheduler, m.Placed, want)
			}
		}
	}
}
