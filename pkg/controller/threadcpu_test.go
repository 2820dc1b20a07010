//go:build linux

package controller

import (
	"testing"
	"time"
)

func TestOnCPUCountsWorkNotSleep(t *testing.T) {
	stop := onCPU()
	time.Sleep(50 * time.Millisecond)
	slept := stop()
	stop = onCPU()
	x := 0
	for start := time.Now(); time.Since(start) < 30*time.Millisecond; {
		x++
	}
	worked := stop()
	if slept > 20*time.Millisecond {
		t.Errorf("50 ms asleep counted %v of CPU", slept)
	}
	if worked < time.Millisecond {
		t.Errorf("30 ms of spinning (%d rounds) counted %v of CPU", x, worked)
	}
}
