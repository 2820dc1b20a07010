package controller

import (
	"testing"
	"time"
)

// TestCPUClockCountsWorkNotWaits: a plan's CPU time is what its goroutine
// ran, so a sleep adds next to nothing and a busy loop adds about its
// length (less on a loaded machine, never more).
func TestCPUClockCountsWorkNotWaits(t *testing.T) {
	stop := startCPUClock()
	time.Sleep(50 * time.Millisecond)
	slept, ok := stop()
	if !ok {
		t.Fatal("the thread's CPU clock cannot be read")
	}
	if slept >= 25*time.Millisecond {
		t.Errorf("sleeping 50ms counted %v of CPU: the clock is not the thread's CPU time", slept)
	}
	start := time.Now()
	stop = startCPUClock()
	for time.Since(start) < 30*time.Millisecond {
	}
	busy, _ := stop()
	wall := time.Since(start)
	if busy <= 0 || busy > wall {
		t.Errorf("a busy loop of %v wall clock counted %v of CPU: want more than 0 and no more than the wall clock", wall, busy)
	}
}
