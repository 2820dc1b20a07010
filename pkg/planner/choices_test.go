package planner

import (
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"
)

// TestBestChoicesIsTheStableSortsHead checks that the bounded selection
// planOnePod uses gives the first k of a stable sort by better, ties in
// node order included, on choices that tie often, for every order
// better keeps.
func TestBestChoicesIsTheStableSortsHead(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	for round := range 2000 {
		n, k, spread, inOrder := r.IntN(60), 1+r.IntN(20), r.IntN(2) == 0, r.IntN(2) == 0
		choices := make([]choice, n)
		for i := range choices {
			choices[i] = choice{node: i, score: float64(r.IntN(3)), left: r.IntN(3) * 1000, leafFree: r.IntN(3), gpuLeft: r.IntN(3) * 250, inOrder: inOrder && !spread, freeNode: r.IntN(2) == 0}
		}
		want := slices.Clone(choices)
		slices.SortStableFunc(want, func(a, b choice) int {
			switch {
			case a.better(b, spread):
				return -1
			case b.better(a, spread):
				return 1
			}
			return 0
		})
		want = want[:min(n, k)]
		if got := bestChoices(choices, k, spread); !slices.Equal(got, want) {
			t.Fatalf("round %d (n=%d k=%d spread=%v):\n got %v\nwant %v", round, n, k, spread, got, want)
		}
	}
}

// TestScoreKeyHasNoPadding keeps scoreKey one block of memory, which the
// map hashes at memory speed: padding makes it hash field by field.
func TestScoreKeyHasNoPadding(t *testing.T) {
	var k scoreKey
	fields := unsafe.Sizeof(k.rest) + unsafe.Sizeof(k.matched) + unsafe.Sizeof(k.free) + unsafe.Sizeof(k.shared) + unsafe.Sizeof(k.slots) + unsafe.Sizeof(k.res)
	if size := unsafe.Sizeof(k); size != fields {
		t.Errorf("scoreKey is %d bytes, its fields %d: reorder or widen them so nothing pads it", size, fields)
	}
}

// TestFGDScore checks the integer score against FGD's: 50 for no change,
// bins about 40 milliGPU wide near it, wider further out.
func TestFGDScore(t *testing.T) {
	for _, tc := range []struct {
		rise float64
		want int64
	}{{0, 50}, {-39, 50}, {-41, 51}, {10, 49}, {39, 49}, {41, 48}, {100, 47}, {-100, 52}, {1000, 26}, {-1000, 73}, {-1e6, 100}, {1e6, 0}} {
		if got := FGDScore(tc.rise); got != tc.want {
			t.Errorf("FGDScore(%v) = %d, want %d", tc.rise, got, tc.want)
		}
	}
}
