package controller

import (
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// onCPU starts counting the CPU time the calling goroutine spends until
// the returned func is called, by keeping it on one thread and reading
// that thread's clock: a slow plan that used little CPU waited for one.
func onCPU() func() time.Duration {
	runtime.LockOSThread()
	start, ok := threadCPU()
	return func() time.Duration {
		end, ok2 := threadCPU()
		runtime.UnlockOSThread()
		if !ok || !ok2 {
			return 0
		}
		return end - start
	}
}

func threadCPU() (time.Duration, bool) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}
