//go:build !linux

package controller

import "time"

// onCPU counts nothing where threads have no CPU clock of their own.
func onCPU() func() time.Duration {
	return func() time.Duration { return 0 }
}
