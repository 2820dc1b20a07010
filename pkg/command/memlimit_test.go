package command

import (
	"context"
	"errors"
	"math"
	"runtime/debug"
	"testing"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

func TestSetMemoryLimit(t *testing.T) {
	t.Cleanup(func() { debug.SetMemoryLimit(math.MaxInt64) })
	limit := func(bytes uint64, err error) memlimit.Provider {
		return func() (uint64, error) { return bytes, err }
	}
	for _, c := range []struct {
		name     string
		env      string // GOMEMLIMIT; "" leaves it unset
		provider memlimit.Provider
		want     int64
	}{
		{"a container limit of 1 GiB", "", limit(1<<30, nil), 966367641}, // 0.9 GiB
		{"no container limit", "", limit(0, memlimit.ErrNoLimit), math.MaxInt64},
		{"GOMEMLIMIT set by the user", "200MiB", limit(1<<30, nil), 123 << 20},
		{"the limit cannot be read", "", limit(0, errors.New("no cgroup")), 123 << 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			debug.SetMemoryLimit(123 << 20) // the limit in force before
			if c.env != "" {
				t.Setenv("GOMEMLIMIT", c.env)
			}
			got := SetMemoryLimit(context.Background(), c.provider)
			if inForce := debug.SetMemoryLimit(-1); got != c.want || inForce != c.want {
				t.Errorf("SetMemoryLimit returned %d, runtime limit %d; want %d", got, inForce, c.want)
			}
		})
	}
}
