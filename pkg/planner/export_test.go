package planner

// SetMoveAnswers turns verify's moving of allocator answers between alike
// nodes on or off, and returns what restores it.
func SetMoveAnswers(on bool) (restore func()) {
	old := moveAnswers
	moveAnswers = on
	return func() { moveAnswers = old }
}

// SetScoreMemo turns planOnePod's sharing of scores between alike nodes
// on or off, and returns what restores it.
func SetScoreMemo(on bool) (restore func()) {
	old := scoreMemo
	scoreMemo = on
	return func() { scoreMemo = old }
}
