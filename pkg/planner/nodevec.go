package planner

import "slices"

// chunkBits sets how many nodes share a chunk of a nodeVec: 128.
const chunkBits = 7

// nodeVec holds a value per node in chunks of 128 nodes, so a copy that
// may change (share) costs one word per chunk, and a change copies only
// its chunk. A chunk whose nodes all have the zero value may be absent. Snapshots, the tracker and each plan's view with the
// reservations counted share chunks this way instead of each copying an
// entry per node of the cluster.
//
// A plain copy of a nodeVec is for reading only; share makes one that
// may change.
type nodeVec[T any] struct {
	chunks [][]T
	owned  []bool // by chunk: this vec's own to change in place
}

func newNodeVec[T any](n int) nodeVec[T] {
	var v nodeVec[T]
	v.grow(n)
	return v
}

// at is node n's value; the zero value past the end.
func (v *nodeVec[T]) at(n int) T {
	c := n >> chunkBits
	if c >= len(v.chunks) || v.chunks[c] == nil {
		var zero T
		return zero
	}
	return v.chunks[c][n&(1<<chunkBits-1)]
}

// set changes node n's value, copying its chunk first when shared.
func (v *nodeVec[T]) set(n int, x T) {
	c := n >> chunkBits
	switch {
	case v.chunks[c] == nil:
		v.chunks[c] = make([]T, 1<<chunkBits)
		v.owned[c] = true
	case !v.owned[c]:
		v.chunks[c] = slices.Clone(v.chunks[c])
		v.owned[c] = true
	}
	v.chunks[c][n&(1<<chunkBits-1)] = x
}

// each calls f with every node of a chunk present, in order.
func (v *nodeVec[T]) each(f func(n int, x T)) {
	for c, ch := range v.chunks {
		for i, x := range ch {
			f(c<<chunkBits+i, x)
		}
	}
}

// share returns a copy that may change; from then on neither v nor the
// copy changes a chunk in place. A vec that owns no chunk, such as a
// finished snapshot's, is only read, so plans may share it at once.
func (v *nodeVec[T]) share() nodeVec[T] {
	v.freeze()
	return nodeVec[T]{chunks: slices.Clone(v.chunks), owned: make([]bool, len(v.chunks))}
}

// freeze gives up ownership of every chunk, so that the vec is only read
// from then on; it writes nothing when it owns none.
func (v *nodeVec[T]) freeze() {
	if slices.Contains(v.owned, true) {
		clear(v.owned)
	}
}

// grow makes room for n nodes; new entries are zero, their chunks absent
// until set.
func (v *nodeVec[T]) grow(n int) {
	for len(v.chunks)<<chunkBits < n {
		v.chunks = append(v.chunks, nil)
		v.owned = append(v.owned, false)
	}
}
