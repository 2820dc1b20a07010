package command

import (
	"context"
	"log/slog"
	"math"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"k8s.io/klog/v2"
)

// MemoryLimitRatio is the share of the container's memory limit that
// SetMemoryLimit gives the Go runtime as its soft limit: the rest is room
// for what the runtime does not count (stacks it has not returned, the
// binary's mapped pages) and for the heap's overshoot.
const MemoryLimitRatio = 0.9

// SetMemoryLimit sets the Go runtime's soft memory limit (GOMEMLIMIT) to
// MemoryLimitRatio of the memory limit provider reports, the container's
// cgroup limit in production (memlimit.FromCgroup). A controller on a large
// cluster holds most of its heap in its informers' caches for good, and
// with Go's default the heap grows to twice that before each collection:
// near the limit the collector now runs earlier instead of the container
// being killed for memory. GOMEMLIMIT in the environment, or
// AUTOMEMLIMIT=off, leaves the runtime's limit as it is, and so does a
// container without a limit. It returns the limit in force.
func SetMemoryLimit(ctx context.Context, provider memlimit.Provider) int64 {
	logger := klog.FromContext(ctx)
	limit, err := memlimit.Set(
		memlimit.WithRatio(MemoryLimitRatio),
		memlimit.WithProvider(provider),
		memlimit.WithLogger(slog.New(slog.DiscardHandler)),
	)
	if err != nil {
		logger.Info("Warning: the Go runtime's memory limit stays as it was: the container's memory limit could not be read", "err", err)
		return limit
	}
	if limit != math.MaxInt64 {
		logger.Info("Go runtime memory limit", "bytes", limit, "ratio", MemoryLimitRatio)
	}
	return limit
}
