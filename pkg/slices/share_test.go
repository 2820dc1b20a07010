package slices_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/gpu/sim"
	"github.com/gputopo/gputopo/pkg/slices"
	"github.com/gputopo/gputopo/pkg/topology"
)

func sharedFixture(t testing.TB, profile, sharing string, labels map[string]string) *fixture {
	t.Helper()
	p, err := sim.LoadBuiltin(profile)
	if err != nil {
		t.Fatal(err)
	}
	cfg := slices.DefaultConfig()
	if cfg.Sharing, err = slices.ParseSharing(sharing); err != nil {
		t.Fatal(err)
	}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-" + profile, Labels: labels}}
	res, err := slices.Build(p.Inventory(node.Name), slices.Node{Name: node.Name, Labels: labels}, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	class := loadSpec[resourceapi.DeviceClass](t, "deviceclass.yaml")
	return &fixture{node: node, slices: slices.Objects(node.Name, res), eval: devicefit.NewEvaluator(devicefit.NewClasses(class))}
}

// fill allocates the templates in turn, on top of each other with the
// scheduler's accounting of shares, until one no longer fits; it returns
// the GPU of every claim that fitted, by template.
func (f *fixture) fill(t testing.TB, state devicefit.State, templates ...string) map[string][]int {
	t.Helper()
	got := map[string][]int{}
	for i, name := range templates {
		tmpl := loadSpec[resourceapi.ResourceClaimTemplate](t, "claims/"+name+".yaml")
		claim := devicefit.ClaimFromTemplate(tmpl, fmt.Sprintf("c%d", i))
		res, err := f.eval.AllocateOn(context.Background(), f.node, f.slices, state.Allocator(), []*resourceapi.ResourceClaim{claim})
		if err != nil {
			t.Fatalf("allocate %s: %v", name, err)
		}
		if res == nil {
			continue
		}
		for _, d := range res[0].Devices.Results {
			var n int
			if _, err := fmt.Sscanf(d.Device, "gpu-%d", &n); err != nil {
				t.Fatalf("unexpected device name %q", d.Device)
			}
			got[name] = append(got[name], n)
		}
		state.Add(res...)
	}
	return got
}

func repeat(n int, names ...string) []string {
	var out []string
	for range n {
		out = append(out, names...)
	}
	return out
}

func each(gpus []int, times int) []int {
	var out []int
	for _, g := range gpus {
		for range times {
			out = append(out, g)
		}
	}
	return out
}

var all8 = []int{0, 1, 2, 3, 4, 5, 6, 7}

func TestSharedGPUs(t *testing.T) {
	tests := map[string]struct {
		profile, sharing string
		labels           map[string]string
		templates        []string
		want             map[string][]int
	}{
		"four quarters per GPU":                       {"dgx-h100", "all", nil, repeat(40, "gpu-share-quarter"), map[string][]int{"gpu-share-quarter": each(all8, 4)}},
		"two halves per GPU":                          {"dgx-h100", "all", nil, repeat(20, "gpu-share-half"), map[string][]int{"gpu-share-half": each(all8, 2)}},
		"20 GiB of an 80 GiB GPU":                     {"dgx-h100", "all", nil, repeat(40, "gpu-share-20gi"), map[string][]int{"gpu-share-20gi": each(all8, 4)}},
		"20 GiB of a 32 GiB GPU":                      {"dgx1-v100", "all", nil, repeat(20, "gpu-share-20gi"), map[string][]int{"gpu-share-20gi": all8}},
		"only the shared GPUs":                        {"dgx-h100", "1,3", nil, repeat(20, "gpu-share-quarter"), map[string][]int{"gpu-share-quarter": each([]int{1, 3}, 4)}},
		"no sharing, no shares":                       {"dgx-h100", "none", nil, repeat(4, "gpu-share-quarter"), map[string][]int{}},
		"node label overrides flag":                   {"dgx-h100", "none", map[string]string{topology.LabelSharedGPUs: "6"}, repeat(8, "gpu-share-half"), map[string][]int{"gpu-share-half": {6, 6}}},
		"a whole-GPU claim takes all of a shared GPU": {"dgx-h100", "all", nil, repeat(10, "gpu-1"), map[string][]int{"gpu-1": all8}},
		// A quarter on a GPU keeps every whole-GPU claim off it, and a GPU
		// held whole takes no share: the fifth quarter goes to GPU 5, past
		// GPUs 1-4 held whole.
		"whole and shared never mix": {"dgx-h100", "all", nil, append([]string{"gpu-share-quarter"}, repeat(10, "gpu-1", "gpu-share-quarter")...),
			map[string][]int{"gpu-share-quarter": {0, 0, 0, 0, 5, 5, 5, 5}, "gpu-1": {1, 2, 3, 4, 6, 7}}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := sharedFixture(t, tc.profile, tc.sharing, tc.labels).fill(t, devicefit.NewState(), tc.templates...)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("GPUs by template (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseSharing(t *testing.T) {
	tests := map[string]struct {
		in      string
		want    slices.Sharing
		wantErr bool
	}{
		"empty":       {in: "", want: slices.Sharing{}},
		"none":        {in: "none", want: slices.Sharing{}},
		"all":         {in: "all", want: slices.Sharing{All: true}},
		"indexes":     {in: "4, 1,4,0", want: slices.Sharing{Indexes: []int{0, 1, 4}}},
		"label form":  {in: "4_1_0", want: slices.Sharing{Indexes: []int{0, 1, 4}}},
		"word":        {in: "some", wantErr: true},
		"negative":    {in: "-1", wantErr: true},
		"empty item":  {in: "1,,2", wantErr: true},
		"mixed empty": {in: "1_,2", wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := slices.ParseSharing(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("error %v, want error %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if err == nil {
				again, _ := slices.ParseSharing(got.String())
				if diff := cmp.Diff(got, again); diff != "" {
					t.Errorf("String does not round-trip (-want +got):\n%s", diff)
				}
			}
		})
	}
	p, _ := sim.LoadBuiltin("dgx-h100")
	_, err := slices.Build(p.Inventory("n"), slices.Node{Name: "n", Labels: map[string]string{topology.LabelSharedGPUs: "half"}}, slices.DefaultConfig(), nil)
	if err == nil || !strings.Contains(err.Error(), topology.LabelSharedGPUs) {
		t.Errorf("a malformed label: want an error naming it, got %v", err)
	}
}
