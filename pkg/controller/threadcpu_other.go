//go:build !linux

package controller

import "time"

// startCPUClock: a goroutine's CPU time is not measured outside Linux.
func startCPUClock() func() (time.Duration, bool) {
	return func() (time.Duration, bool) { return 0, false }
}
