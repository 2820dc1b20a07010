package mps_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	gosync "sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gputopo/gputopo/pkg/gpu"
	"github.com/gputopo/gputopo/pkg/mps"
	"github.com/gputopo/gputopo/pkg/mps/mpstest"
)

// fakeModes is a node's GPUs' compute modes, as NVML keeps them: they
// outlive a manager. Each set is logged with what the stand-in had
// recorded for that GPU by then.
type fakeModes struct {
	mu     gosync.Mutex
	record string
	modes  map[string]gpu.ComputeMode
	setErr error
	sets   []modeSet
}

type modeSet struct {
	UUID string
	Mode gpu.ComputeMode
	// Daemon is the stand-in's last event for the GPU when the mode was
	// set ("" for none).
	Daemon string
}

func (f *fakeModes) ComputeMode(uuid string) (gpu.ComputeMode, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if m, ok := f.modes[uuid]; ok {
		return m, nil
	}
	return gpu.ComputeModeDefault, nil
}

func (f *fakeModes) SetComputeMode(uuid string, mode gpu.ComputeMode) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.setErr != nil {
		return f.setErr
	}
	last := ""
	events, _ := mpstest.Read(f.record)
	for _, e := range events {
		if e.VisibleDevices == uuid {
			last = e.Kind
		}
	}
	f.modes[uuid] = mode
	f.sets = append(f.sets, modeSet{UUID: uuid, Mode: mode, Daemon: last})
	return nil
}

// takeSets returns the sets since the last call.
func (f *fakeModes) takeSets() []modeSet {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.sets
	f.sets = nil
	return out
}

func (f *fakeModes) mode(uuid string) gpu.ComputeMode {
	m, _ := f.ComputeMode(uuid)
	return m
}

func (f fixture) modes(initial map[string]gpu.ComputeMode) *fakeModes {
	return &fakeModes{record: f.record, modes: initial}
}

func (f fixture) managerWith(t *testing.T, modes gpu.ComputeModes) *mps.Manager {
	t.Helper()
	m, err := mps.New(mps.Config{ControlPath: f.control, Root: f.root, ComputeModes: modes, StopTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Sync(context.Background(), nil) })
	return m
}

// TestComputeModeAroundDaemon: a GPU is set to EXCLUSIVE_PROCESS before
// its daemon starts, left so while it runs, and set back to the mode it
// had (DEFAULT for one, PROHIBITED for the other) after the daemon ended.
func TestComputeModeAroundDaemon(t *testing.T) {
	f := newFixture(t)
	modes := f.modes(map[string]gpu.ComputeMode{gpuB: gpu.ComputeModeProhibited})
	m := f.managerWith(t, modes)
	lim := mps.Limits{ActiveThreadPercentage: 50}

	sync(t, m, map[string]mps.Limits{gpuA: lim, gpuB: lim})
	want := []modeSet{{gpuA, gpu.ComputeModeExclusiveProcess, ""}, {gpuB, gpu.ComputeModeExclusiveProcess, ""}}
	if diff := cmp.Diff(want, modes.takeSets()); diff != "" {
		t.Errorf("first shares: compute mode sets (-want +got; Daemon is the daemon's last event then, none before it starts):\n%s", diff)
	}
	sync(t, m, map[string]mps.Limits{gpuA: lim, gpuB: {ActiveThreadPercentage: 10}})
	if got := modes.takeSets(); len(got) != 0 {
		t.Errorf("running daemons: compute modes set %v, want none", got)
	}

	sync(t, m, map[string]mps.Limits{gpuA: lim})
	sync(t, m, nil)
	want = []modeSet{{gpuB, gpu.ComputeModeProhibited, mpstest.Exit}, {gpuA, gpu.ComputeModeDefault, mpstest.Exit}}
	if diff := cmp.Diff(want, modes.takeSets()); diff != "" {
		t.Errorf("last shares gone: compute mode sets (-want +got; Daemon is the daemon's last event then, exit once it ended):\n%s", diff)
	}
	for uuid, was := range map[string]gpu.ComputeMode{gpuA: gpu.ComputeModeDefault, gpuB: gpu.ComputeModeProhibited} {
		if got := modes.mode(uuid); got != was {
			t.Errorf("%s ends in compute mode %s, want %s, the mode before its daemon", uuid, got, was)
		}
	}
	if _, err := os.Stat(filepath.Join(f.root, gpuA)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("MPS directory of %s after its mode was set back: %v, want it gone", gpuA, err)
	}
}

// TestComputeModeRestartRecovery: a restarted plugin puts a GPU whose
// daemon runs back into EXCLUSIVE_PROCESS when its mode was changed, keeps
// the mode recorded before the daemon, and gives a GPU with no daemon and
// no share that recorded mode back.
func TestComputeModeRestartRecovery(t *testing.T) {
	f := newFixture(t)
	modes := f.modes(map[string]gpu.ComputeMode{gpuA: gpu.ComputeModeProhibited})
	lim := mps.Limits{ActiveThreadPercentage: 50}
	sync(t, f.managerWith(t, modes), map[string]mps.Limits{gpuA: lim, gpuB: lim})
	pidA := f.managerWith(t, modes).Running(gpuA)
	modes.takeSets()

	// Someone resets A's mode while the plugin is down.
	modes.modes[gpuA] = gpu.ComputeModeDefault
	restarted := f.managerWith(t, modes)
	sync(t, restarted, map[string]mps.Limits{gpuA: lim})
	want := []modeSet{{gpuB, gpu.ComputeModeDefault, mpstest.Exit}, {gpuA, gpu.ComputeModeExclusiveProcess, mpstest.Command}}
	if diff := cmp.Diff(want, modes.takeSets()); diff != "" {
		t.Errorf("restart wanting A only: compute mode sets (-want +got):\n%s", diff)
	}
	if got := restarted.Running(gpuA); got != pidA {
		t.Errorf("daemon of %s is pid %d, want %d running on", gpuA, got, pidA)
	}

	// A's daemon dies with the plugin, and its share goes meanwhile.
	pgid, err := syscall.Getpgid(pidA)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(-pgid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pidA)
	sync(t, f.managerWith(t, modes), nil)
	if got := modes.mode(gpuA); got != gpu.ComputeModeProhibited {
		t.Errorf("%s with no daemon and no share after a restart: compute mode %s, want %s, recorded before its daemon", gpuA, got, gpu.ComputeModeProhibited)
	}
	if _, err := os.Stat(filepath.Join(f.root, gpuA)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("MPS directory of %s: %v, want it gone", gpuA, err)
	}
}

// TestComputeModeFailure: a GPU whose mode cannot be set gets no daemon,
// and the error says what failed and what to do; a mode that cannot be
// set back keeps its record until it can.
func TestComputeModeFailure(t *testing.T) {
	f := newFixture(t)
	modes := f.modes(map[string]gpu.ComputeMode{})
	modes.setErr = errors.New("Insufficient Permissions")
	m := f.managerWith(t, modes)
	lim := mps.Limits{ActiveThreadPercentage: 50}

	err := m.Sync(context.Background(), map[string]mps.Limits{gpuA: lim})
	if err == nil {
		t.Fatal("Sync with a mode that cannot be set: no error")
	}
	for _, w := range []string{gpuA, "gets no MPS control daemon", "Insufficient Permissions", "EXCLUSIVE_PROCESS", "root", "privileged"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not say %q", err, w)
		}
	}
	t.Log(err)
	if events, _ := mpstest.Read(f.record); len(events) != 0 || m.Running(gpuA) != 0 {
		t.Errorf("a daemon was started although the mode was not set: %v", events)
	}
	modes.setErr = nil
	sync(t, m, nil)
	if got := modes.takeSets(); len(got) != 0 {
		t.Errorf("after a failed start: compute modes set %v, want none (nothing was changed)", got)
	}

	// Setting the mode back fails: the record stays, the next sync does it.
	sync(t, m, map[string]mps.Limits{gpuA: lim})
	modes.setErr = errors.New("Insufficient Permissions")
	err = m.Sync(context.Background(), nil)
	if err == nil || !strings.Contains(err.Error(), "back to compute mode DEFAULT") {
		t.Fatalf("Sync that cannot set the mode back = %v, want an error saying so", err)
	}
	if m.Running(gpuA) != 0 {
		t.Error("the daemon runs on")
	}
	modes.setErr = nil
	sync(t, m, nil)
	if got := modes.mode(gpuA); got != gpu.ComputeModeDefault {
		t.Errorf("compute mode after the retry: %s, want %s", got, gpu.ComputeModeDefault)
	}
	if _, err := os.Stat(filepath.Join(f.root, gpuA)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("MPS directory of %s: %v, want it gone", gpuA, err)
	}
}
