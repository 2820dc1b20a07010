package planner

import "testing"

// A vec and the copies share makes change apart: a change to one, on
// either side of the share, is never seen by the other, however many
// copies share a chunk.
func TestNodeVecCopiesChangeApart(t *testing.T) {
	const n = 300 // three chunks, the last partly used
	v := newNodeVec[int](n)
	for i := range n {
		v.set(i, i)
	}
	a := v.share()
	b := a.share()
	v.set(5, -1)
	a.set(130, -2)
	b.set(299, -3)
	v.set(131, -4) // v no longer owns its chunks either
	check := func(name string, x *nodeVec[int], changed map[int]int) {
		t.Helper()
		for i := range n {
			want := i
			if c, ok := changed[i]; ok {
				want = c
			}
			if got := x.at(i); got != want {
				t.Errorf("%s: node %d is %d, want %d", name, i, got, want)
			}
		}
	}
	check("v", &v, map[int]int{5: -1, 131: -4})
	check("a", &a, map[int]int{130: -2})
	check("b", &b, map[int]int{299: -3})
	if got := v.at(1000); got != 0 {
		t.Errorf("past the end: %d, want 0", got)
	}
	v.grow(1000)
	v.set(999, 7)
	if got := a.at(999); got != 0 {
		t.Errorf("a grew with v: node 999 is %d", got)
	}
}

// A vec allocates a chunk only when one of its nodes is set, and each
// visits the chunks present.
func TestNodeVecChunksOnlyWhereSet(t *testing.T) {
	v := newNodeVec[*int](1000)
	one := 1
	v.set(700, &one)
	present := 0
	for _, ch := range v.chunks {
		if ch != nil {
			present++
		}
	}
	if present != 1 {
		t.Errorf("%d chunks present, want 1", present)
	}
	var seen []int
	v.each(func(n int, x *int) {
		if x != nil {
			seen = append(seen, n)
		}
	})
	if len(seen) != 1 || seen[0] != 700 {
		t.Errorf("each saw %v, want [700]", seen)
	}
	if v.at(5) != nil || v.at(700) != &one {
		t.Error("at does not return what was set")
	}
}
