package controller

import (
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// startCPUClock starts measuring the calling goroutine's CPU time. The
// goroutine keeps its OS thread until the returned function, which gives
// the CPU time since the start (garbage-collection work the goroutine was
// charged included), is called; false when the clock cannot be read.
func startCPUClock() func() (time.Duration, bool) {
	runtime.LockOSThread()
	start, ok := threadCPU()
	return func() (time.Duration, bool) {
		defer runtime.UnlockOSThread()
		end, ok2 := threadCPU()
		if !ok || !ok2 {
			return 0, false
		}
		return end - start, true
	}
}

// threadCPU is the CPU time the calling OS thread has used.
func threadCPU() (time.Duration, bool) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}
