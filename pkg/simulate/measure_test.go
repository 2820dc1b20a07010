package simulate

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The FGD artifact's measure, worked by hand on a cluster of 4 GPUs
// (4,000 milli-GPUs) at 130 % demand: a line's arrived demand in percent
// is arrived / 40 rounded half to even, its allocation used / 40 rounded
// to two decimals; the figure is the mean over the lines at 130 %, or
// over those at 129–131 % when none is.
func TestArtifactAllocation(t *testing.T) {
	for _, tc := range []struct {
		name    string
		samples []allocSample
		gpus    int     // 4 if 0
		want    float64 // percent
		ok      bool
	}{{
		// 5180 / 40 = 129.5 → 130 and 5220 / 40 = 130.5 → 130 (half to
		// even; half away from zero would make it 131), 5260 / 40 =
		// 131.5 → 132. At 130: 82.5, 85 and 85.25, mean 84.25 — not
		// 87.5, the allocation after the last arrival.
		name: "lines at the percent",
		samples: []allocSample{
			{0, 0}, {5100, 3000}, {5180, 3300}, {5200, 3400}, {5220, 3410}, {5260, 3500},
		},
		want: 84.25, ok: true,
	}, {
		// None rounds to 130: 5140 / 40 = 128.5 → 128 (half to even) is
		// out, 5170 → 129.25 → 129 and 5230 → 130.75 → 131 are in, 5260
		// → 132 is out. Mean of 77.5 and 80: 78.75 (77.5 with 5140's 75
		// wrongly in).
		name: "widened to ± 1 %",
		samples: []allocSample{
			{0, 0}, {5140, 3000}, {5170, 3100}, {5230, 3200}, {5260, 3300},
		},
		want: 78.75, ok: true,
	}, {
		// Each line's allocation is rounded before the mean, then the
		// mean (cluster of 1,000 GPUs: used / 10,000): 130.006, 130.006
		// and 130.001 round to 130.01, 130.01 and 130.00, mean 130.0067
		// → 130.01; unrounded the mean is 130.0043 → 130.00.
		name: "each line rounded", gpus: 1000,
		samples: []allocSample{
			{1300000, 1300060}, {1300000, 1300060}, {1300000, 1300010},
		},
		want: 130.01, ok: true,
	}, {
		name:    "nothing near the demand",
		samples: []allocSample{{0, 0}, {4000, 4000}, {5100, 4000}},
		ok:      false,
	}} {
		gpus := tc.gpus
		if gpus == 0 {
			gpus = 4
		}
		got, ok := artifactAllocation(tc.samples, gpus, 1.3)
		if ok != tc.ok || !approx(100*got, tc.want) {
			t.Errorf("%s: %.4f %%, %v; want %.4f %%, %v", tc.name, 100*got, ok, tc.want, tc.ok)
		}
	}
}

func approx(a, b float64) bool { d := a - b; return d < 1e-9 && d > -1e-9 }

// Python's round(x, 2): correctly rounded, an exact tie to even.
func TestRound2(t *testing.T) {
	for in, want := range map[float64]float64{
		82.5:    82.5,
		66.6666: 66.67,
		0.125:   0.12, // exact tie: to even
		0.375:   0.38, // exact tie: to even
		2.675:   2.67, // 2.67499999… in binary
		1.005:   1,    // 1.00499999…
	} {
		if got := round2(in); got != want {
			t.Errorf("round2(%v) = %v, want %v", in, got, want)
		}
	}
}

// numpy's pairwise sum adds the first eight lanes apart, then the rest.
func TestPairwiseSum(t *testing.T) {
	a := make([]float64, 300)
	for i := range a {
		a[i] = float64(i)
	}
	for _, n := range []int{0, 1, 7, 8, 9, 128, 129, 300} {
		w := float64(n*(n-1)) / 2
		if got := pairwiseSum(a[:n]); got != w {
			t.Errorf("pairwiseSum(0..%d) = %v, want %v", n-1, got, w)
		}
	}
	// Order shows above 2^53, where float64s are 2 apart and x + 1 ties
	// to the even neighbour. Nine terms: the eight lanes (2^53, 1, ...,
	// 1) sum as ((2^53+1) + (1+1)) + ((1+1) + (1+1)) = (2^53 + 2) + 4 =
	// 2^53 + 6, then + 1 ties up to 2^53 + 8; one by one every + 1 is
	// lost: 2^53.
	const big = 1 << 53
	nine := []float64{big, 1, 1, 1, 1, 1, 1, 1, 1}
	if got := pairwiseSum(nine); got != big+8 {
		t.Errorf("pairwiseSum(2^53, eight 1s) = 2^53 + %v, want 2^53 + 8", got-big)
	}
}

// A static replay logs a line before the first arrival and after every
// one: a pod that does not fit counts as arrived, a pod without GPUs
// adds a line.
func TestStaticReplaySamples(t *testing.T) {
	c := clusterOf(t, 1, 1, 1) // one node of 8 GPUs
	jobs := []Job{
		{Name: "a", Pods: 1, GPUsPerPod: 8, MilliGPU: 8000},
		{Name: "b", Pods: 1, GPUsPerPod: 1, MilliGPU: 500, Shared: true},
		{Name: "cpu", Pods: 1},
	}
	m, err := replay(context.Background(), c, jobs, false, newFirstFit(c, demoClaims(t)), NoLocality())
	if err != nil {
		t.Fatal(err)
	}
	want := []allocSample{{0, 0}, {8000, 8000}, {8500, 8000}, {8500, 8000}}
	if diff := cmp.Diff(want, m.arrivals, cmp.AllowUnexported(allocSample{})); diff != "" {
		t.Errorf("samples (-want +got):\n%s", diff)
	}
}
