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
