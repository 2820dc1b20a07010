package mps_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gputopo/gputopo/pkg/mps"
	"github.com/gputopo/gputopo/pkg/mps/mpstest"
)

const (
	gpuA = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
	gpuB = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
)

type fixture struct {
	root, record, control string
}

func newFixture(t *testing.T) fixture {
	t.Helper()
	dir := t.TempDir()
	f := fixture{root: filepath.Join(dir, "mps"), record: filepath.Join(dir, "record")}
	var err error
	if f.control, err = mpstest.Write(dir, f.record); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f fixture) manager(t *testing.T) *mps.Manager {
	t.Helper()
	m, err := mps.New(mps.Config{ControlPath: f.control, Root: f.root, StopTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// Never leave a daemon behind, whatever the test did.
	t.Cleanup(func() { _ = m.Sync(context.Background(), nil) })
	return m
}

// events returns what the stand-in recorded since the last call, without
// the pids (they differ each run).
func (f fixture) events(t *testing.T, seen *int) []mpstest.Event {
	t.Helper()
	all, err := mpstest.Read(f.record)
	if err != nil {
		t.Fatal(err)
	}
	out := all[*seen:]
	*seen = len(all)
	for i := range out {
		out[i].PID = ""
	}
	return out
}

func (f fixture) start(uuid string) mpstest.Event {
	return mpstest.Event{Kind: mpstest.Start, VisibleDevices: uuid, PipeDir: filepath.Join(f.root, uuid[4:12], "pipe"), LogDir: filepath.Join(f.root, uuid[4:12], "log")}
}

func (f fixture) command(uuid, c string) mpstest.Event {
	e := f.start(uuid)
	e.Kind, e.Command = mpstest.Command, c
	return e
}

func (f fixture) exit(uuid string) mpstest.Event {
	e := f.start(uuid)
	e.Kind = mpstest.Exit
	return e
}

func sync(t *testing.T, m *mps.Manager, want map[string]mps.Limits) {
	t.Helper()
	if err := m.Sync(context.Background(), want); err != nil {
		t.Fatal(err)
	}
}

// TestDaemonLifecycle: the first share of a GPU starts its daemon with the
// GPU's pipe and log directories and sends its limits; another sync with
// the same shares starts nothing; a second GPU gets its own daemon; a
// smaller share changes the limits of the running daemon without
// restarting it; the last share gone stops the daemon (quit) and removes
// its directory.
func TestDaemonLifecycle(t *testing.T) {
	f := newFixture(t)
	m := f.manager(t)
	seen := 0
	quarter := mps.Limits{ActiveThreadPercentage: 25, PinnedMemoryBytes: 20 << 30}
	step := func(name string, want map[string]mps.Limits, events []mpstest.Event) {
		t.Helper()
		sync(t, m, want)
		// A stopped daemon records its exit as it ends: wait for it.
		deadline := time.Now().Add(10 * time.Second)
		var got []mpstest.Event
		for {
			got = append(got, f.events(t, &seen)...)
			if len(got) >= len(events) || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if diff := cmp.Diff(events, got); diff != "" {
			t.Fatalf("%s: stand-in record (-want +got):\n%s", name, diff)
		}
		for uuid := range want {
			if m.Running(uuid) == 0 {
				t.Errorf("%s: no daemon runs for %s", name, uuid)
			}
		}
	}

	step("first share", map[string]mps.Limits{gpuA: quarter}, []mpstest.Event{
		f.start(gpuA),
		f.command(gpuA, "set_default_active_thread_percentage 25"),
		f.command(gpuA, "set_default_device_pinned_mem_limit 0 20480M"),
	})
	pid := m.Running(gpuA)
	step("same shares", map[string]mps.Limits{gpuA: quarter}, nil)
	step("second GPU", map[string]mps.Limits{gpuA: quarter, gpuB: {ActiveThreadPercentage: 50}}, []mpstest.Event{
		f.start(gpuB),
		f.command(gpuB, "set_default_active_thread_percentage 50"),
	})
	step("smaller share on A, B's last share gone", map[string]mps.Limits{gpuA: {ActiveThreadPercentage: 10, PinnedMemoryBytes: 1 << 30}}, []mpstest.Event{
		f.command(gpuB, "quit"),
		f.exit(gpuB),
		f.command(gpuA, "set_default_active_thread_percentage 10"),
		f.command(gpuA, "set_default_device_pinned_mem_limit 0 1024M"),
	})
	if got := m.Running(gpuA); got != pid {
		t.Errorf("daemon of %s is pid %d, want %d: it was restarted", gpuA, got, pid)
	}
	if _, err := os.Stat(filepath.Join(f.root, gpuB)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("directory of %s after its daemon stopped: %v, want it gone", gpuB, err)
	}
	step("last share gone", nil, []mpstest.Event{f.command(gpuA, "quit"), f.exit(gpuA)})
	if alive(pid) {
		t.Errorf("daemon pid %d still runs", pid)
	}
}

// TestRestartRecovery: a new manager over the same directory (a restarted
// plugin) keeps a running daemon that is still wanted, stops one that is
// not, starts again one that died (clearing the pipes it left), and does
// not take a stale pid file naming another program for a daemon.
func TestRestartRecovery(t *testing.T) {
	f := newFixture(t)
	seen := 0
	first := f.manager(t)
	lim := mps.Limits{ActiveThreadPercentage: 50}
	sync(t, first, map[string]mps.Limits{gpuA: lim, gpuB: lim})
	pidA, pidB := first.Running(gpuA), first.Running(gpuB)
	f.events(t, &seen)

	restarted := f.manager(t)
	sync(t, restarted, map[string]mps.Limits{gpuA: lim})
	if got := restarted.Running(gpuA); got != pidA {
		t.Errorf("after restart the daemon of %s is pid %d, want the running %d", gpuA, got, pidA)
	}
	waitGone(t, pidB)
	if diff := cmp.Diff([]mpstest.Event{f.command(gpuB, "quit"), f.exit(gpuB)}, f.events(t, &seen)); diff != "" {
		t.Errorf("restart: stand-in record (-want +got):\n%s", diff)
	}

	// The daemon dies with the plugin's container (its whole process
	// group here); its pipes stay.
	pgid, err := syscall.Getpgid(pidA)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(-pgid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pidA)
	stale := filepath.Join(restarted.PipeDir(gpuA), "control")
	if err := os.WriteFile(stale, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	again := f.manager(t)
	sync(t, again, map[string]mps.Limits{gpuA: lim})
	if got := again.Running(gpuA); got == 0 || got == pidA {
		t.Errorf("after the daemon died, %s runs pid %d, want a new daemon", gpuA, got)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pipe a dead daemon left: %v, want it removed", err)
	}

	// A pid file naming a live process that is no daemon (this test).
	sync(t, again, nil)
	f.events(t, &seen)
	if err := os.MkdirAll(again.PipeDir(gpuB), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(again.PipeDir(gpuB), mps.PidFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := again.Running(gpuB); got != 0 {
		t.Fatalf("pid file naming this test: Running = %d, want 0", got)
	}
	sync(t, again, map[string]mps.Limits{gpuB: lim})
	if got := f.events(t, &seen); len(got) == 0 || got[0] != f.start(gpuB) {
		t.Errorf("stale pid file: stand-in record %v, want a start of %s first", got, gpuB)
	}
}

// TestMissingControl: a share on a node without the control program fails
// with ErrNoControl, naming the path and the flag.
func TestMissingControl(t *testing.T) {
	m, err := mps.New(mps.Config{ControlPath: "/nonexistent/nvidia-cuda-mps-control", Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	err = m.Sync(context.Background(), map[string]mps.Limits{gpuA: {ActiveThreadPercentage: 50}})
	if !errors.Is(err, mps.ErrNoControl) {
		t.Fatalf("Sync = %v, want ErrNoControl", err)
	}
	t.Log(err)
}

// TestShortDaemonDirectories: a GPU's daemon directory is named by the
// first eight hex digits of its UUID, so that the pipe directory of the
// kubelet's default plugin directory stays well under MaxPipeDir. A daemon
// that an earlier version started in a directory named by the whole UUID
// is kept across a restart, found there, and stopped and removed once its
// GPU has no share; such a directory with no daemon is moved to the short
// name when the GPU's daemon starts, the record of its mode with it.
func TestShortDaemonDirectories(t *testing.T) {
	m, err := mps.New(mps.Config{ControlPath: "/usr/bin/" + mps.ControlName, Root: "/var/lib/kubelet/plugins/gpu.gputopo.dev/mps"})
	if err != nil {
		t.Fatal(err)
	}
	uuid := "GPU-6d93d6b4-9451-4fd6-9f30-b8be52a2d5da"
	if got, want := m.PipeDir(uuid), "/var/lib/kubelet/plugins/gpu.gputopo.dev/mps/6d93d6b4/pipe"; got != want || len(got) > mps.MaxPipeDir {
		t.Errorf("pipe directory %s (%d bytes), want %s, at most %d", got, len(got), want, mps.MaxPipeDir)
	}

	f := newFixture(t)
	seen := 0
	// gpuA's daemon, as an earlier version started it.
	legacy := filepath.Join(f.root, gpuA)
	for _, d := range []string{"pipe", "log"} {
		if err := os.MkdirAll(filepath.Join(legacy, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	start := exec.Command(f.control, "-d")
	start.Env = []string{"PATH=/usr/bin:/bin", "CUDA_VISIBLE_DEVICES=" + gpuA, "CUDA_MPS_PIPE_DIRECTORY=" + filepath.Join(legacy, "pipe"), "CUDA_MPS_LOG_DIRECTORY=" + filepath.Join(legacy, "log")}
	start.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if out, err := start.CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	// gpuB's directory from an earlier version, its daemon gone, the mode
	// it had recorded.
	legacyB := filepath.Join(f.root, gpuB)
	if err := os.MkdirAll(legacyB, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(legacyB, "previous-compute-mode"), []byte("PROHIBITED\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	earlier := f.manager(t)
	var pidA int
	for deadline := time.Now().Add(10 * time.Second); pidA == 0; pidA = earlier.Running(gpuA) {
		if time.Now().After(deadline) {
			t.Fatal("the earlier version's daemon did not start")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := earlier.PipeDir(gpuA); got != filepath.Join(legacy, "pipe") {
		t.Errorf("with a daemon running in a directory named by the whole UUID, the pipe directory is %s, want %s", got, filepath.Join(legacy, "pipe"))
	}
	f.events(t, &seen)

	lim := mps.Limits{ActiveThreadPercentage: 50}
	sync(t, earlier, map[string]mps.Limits{gpuA: lim, gpuB: lim})
	if got := earlier.Running(gpuA); got != pidA {
		t.Errorf("the daemon of %s is pid %d, want the running %d", gpuA, got, pidA)
	}
	if got := f.events(t, &seen); len(got) != 3 || got[0].Command != "set_default_active_thread_percentage 50" || got[0].PipeDir != filepath.Join(legacy, "pipe") ||
		got[1] != f.start(gpuB) || got[2] != f.command(gpuB, "set_default_active_thread_percentage 50") {
		t.Errorf("stand-in record %v, want limits for %s's running daemon and a start of %s in its short directory", got, gpuA, gpuB)
	}
	if data, err := os.ReadFile(filepath.Join(f.root, "bbbbbbbb", "previous-compute-mode")); err != nil || string(data) != "PROHIBITED\n" {
		t.Errorf("%s's mode record after its directory moved: %q, %v", gpuB, data, err)
	}
	if _, err := os.Stat(legacyB); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s's directory of the earlier version: %v, want it moved", gpuB, err)
	}

	restarted := f.manager(t)
	sync(t, restarted, map[string]mps.Limits{gpuA: lim, gpuB: lim})
	if got := f.events(t, &seen); len(got) != 0 {
		t.Errorf("restart with running daemons: stand-in record %v, want nothing", got)
	}
	sync(t, restarted, map[string]mps.Limits{gpuB: lim})
	waitGone(t, pidA)
	if _, err := os.Stat(legacy); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the earlier version's directory of %s after its last share: %v, want it removed", gpuA, err)
	}
	entries, err := os.ReadDir(f.root)
	if err != nil || len(entries) != 1 || entries[0].Name() != "bbbbbbbb" {
		t.Errorf("daemon directories %v (%v), want only bbbbbbbb", entries, err)
	}
}

// TestAlikeUUIDs: two GPUs whose UUIDs begin with the same eight hex
// digits would share a daemon directory; it stays the GPU's whose record
// it holds, the other's share fails saying why and touches neither the
// daemon nor the record; an unreadable record is the directory's name.
func TestAlikeUUIDs(t *testing.T) {
	f := newFixture(t)
	seen := 0
	m := f.manager(t)
	twin := "GPU-aaaaaaaa-1111-0000-0000-000000000000" // sorts after gpuA
	lim := mps.Limits{ActiveThreadPercentage: 50}
	sync(t, m, map[string]mps.Limits{twin: lim})
	pid := m.Running(twin)
	f.events(t, &seen)
	err := m.Sync(context.Background(), map[string]mps.Limits{gpuA: {ActiveThreadPercentage: 10}, twin: lim})
	if err == nil || !strings.Contains(err.Error(), gpuA) || !strings.Contains(err.Error(), twin+"'s") {
		t.Errorf("Sync with two alike UUIDs = %v, want %s refused, the directory being %s's", err, gpuA, twin)
	}
	if got := f.events(t, &seen); len(got) != 0 {
		t.Errorf("stand-in record %v, want nothing sent to %s's daemon", got, twin)
	}
	if got := m.Running(twin); got != pid {
		t.Errorf("%s's daemon is pid %d, want %d", twin, got, pid)
	}
	data, err := os.ReadFile(filepath.Join(f.root, "aaaaaaaa", "uuid"))
	if err != nil || strings.TrimSpace(string(data)) != twin {
		t.Errorf("record %q (%v), want %s", data, err, twin)
	}

	// A torn record (empty) names no GPU: the directory goes by its name,
	// and a sync without shares removes it.
	sync(t, m, nil)
	if err := os.MkdirAll(filepath.Join(f.root, "cccccccc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.root, "cccccccc", "uuid"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	sync(t, m, nil)
	if entries, err := os.ReadDir(f.root); err != nil || len(entries) != 0 {
		t.Errorf("daemon directories %v (%v), want none", entries, err)
	}
}

// TestLongPipeDirectorySaysWhy: where a plugin directory is so deep that
// the pipe directory passes MaxPipeDir, a control program that exits 1
// saying nothing (as the driver's does there) fails the share with the
// reason and the flag to change.
func TestLongPipeDirectorySaysWhy(t *testing.T) {
	dir := t.TempDir()
	control := filepath.Join(dir, mps.ControlName)
	script := fmt.Sprintf("#!/bin/sh\n[ ${#CUDA_MPS_PIPE_DIRECTORY} -gt %d ] && exit 1\necho started\nexit 1\n", mps.MaxPipeDir)
	if err := os.WriteFile(control, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		root string
		long bool
	}{
		{filepath.Join(dir, strings.Repeat("d", mps.MaxPipeDir)), true},
		{dir, false},
	} {
		m, err := mps.New(mps.Config{ControlPath: control, Root: tc.root})
		if err != nil {
			t.Fatal(err)
		}
		err = m.Sync(context.Background(), map[string]mps.Limits{gpuA: {ActiveThreadPercentage: 50}})
		if err == nil {
			t.Fatal("the control program exits 1: the share started")
		}
		says := strings.Contains(err.Error(), "bytes long") && strings.Contains(err.Error(), "--kubelet-plugins-directory-path")
		if says != tc.long {
			t.Errorf("pipe directory of %d bytes: error %q; want it to blame the length: %v", len(m.PipeDir(gpuA)), err, tc.long)
		}
	}
}

// TestFailedStartSaysWhy: a control program that exits at once fails the
// share with what it printed, which the kubelet shows on the pod where the
// node's log file cannot be read, and the log's path.
func TestFailedStartSaysWhy(t *testing.T) {
	dir := t.TempDir()
	control := filepath.Join(dir, "nvidia-cuda-mps-control")
	if err := os.WriteFile(control, []byte("#!/bin/sh\necho \"An instance of this daemon is already running\"\necho \"pipe directory $CUDA_MPS_PIPE_DIRECTORY\" >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	m, err := mps.New(mps.Config{ControlPath: control, Root: filepath.Join(dir, "mps")})
	if err != nil {
		t.Fatal(err)
	}
	err = m.Sync(context.Background(), map[string]mps.Limits{gpuA: {ActiveThreadPercentage: 50}})
	if err == nil {
		t.Fatal("a control program that exits 1: the share started")
	}
	for _, want := range []string{"exit status 1", "An instance of this daemon is already running; pipe directory " + m.PipeDir(gpuA), filepath.Join(m.LogDir(gpuA), "start.log")} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

func TestLimitsCommands(t *testing.T) {
	for name, tc := range map[string]struct {
		l    mps.Limits
		want []string
	}{
		"compute only": {mps.Limits{ActiveThreadPercentage: 30}, []string{"set_default_active_thread_percentage 30"}},
		"with memory":  {mps.Limits{ActiveThreadPercentage: 100, PinnedMemoryBytes: 80 << 30}, []string{"set_default_active_thread_percentage 100", "set_default_device_pinned_mem_limit 0 81920M"}},
	} {
		if diff := cmp.Diff(tc.want, tc.l.Commands()); diff != "" {
			t.Errorf("%s (-want +got):\n%s", name, diff)
		}
	}
}

func alive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	return err == nil && !containsState(stat, 'Z')
}

func containsState(stat []byte, s byte) bool {
	for i := len(stat) - 1; i >= 0; i-- {
		if stat[i] == ')' {
			return i+2 < len(stat) && stat[i+2] == s
		}
	}
	return false
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d still runs", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestShmIsATmpfsWhileTheDaemonRuns: with ShmSize set, a GPU's shm
// directory is a tmpfs of that size from its daemon's start, a manager
// that starts again (a plugin restart) keeps that one mount and stacks no
// second, and the last share gone unmounts it with the directory; without
// ShmSize it is a plain directory.
func TestShmIsATmpfsWhileTheDaemonRuns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	f := newFixture(t)
	newManager := func(size string) *mps.Manager {
		m, err := mps.New(mps.Config{ControlPath: f.control, Root: f.root, ShmSize: size, StopTimeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Sync(context.Background(), nil) })
		return m
	}
	m := newManager("1048576")
	shm := m.ShmDir(gpuA)
	sync(t, m, map[string]mps.Limits{gpuA: {ActiveThreadPercentage: 50}})
	if got := shmMounts(t, shm); len(got) != 1 || got[0] != mps.ShmSource+" tmpfs size=1024k" {
		t.Fatalf("mounts at %s with the daemon running: %q, want one %s tmpfs of 1024k", shm, got, mps.ShmSource)
	}
	if err := os.WriteFile(filepath.Join(shm, "segment"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}

	again := newManager("1048576")
	sync(t, again, map[string]mps.Limits{gpuA: {ActiveThreadPercentage: 50}})
	if got := shmMounts(t, shm); len(got) != 1 {
		t.Errorf("mounts at %s after a restart: %q, want the one of before", shm, got)
	}

	sync(t, again, nil)
	if got := shmMounts(t, shm); len(got) != 0 {
		t.Errorf("mounts at %s after the last share: %q, want none", shm, got)
	}
	if _, err := os.Stat(filepath.Join(f.root, gpuA)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("MPS directory of %s after the last share: %v, want it removed", gpuA, err)
	}

	plain := newManager("")
	sync(t, plain, map[string]mps.Limits{gpuB: {ActiveThreadPercentage: 50}})
	if got := shmMounts(t, plain.ShmDir(gpuB)); len(got) != 0 {
		t.Errorf("mounts at %s without a size: %q, want a plain directory", plain.ShmDir(gpuB), got)
	}
}

// shmMounts lists "source fstype size=..." of each mount at dir in this
// process's mount table.
func shmMounts(t *testing.T, dir string) []string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS
		before, after, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(before), strings.Fields(after)
		if !ok || len(f) < 5 || len(g) < 3 || f[4] != dir {
			continue
		}
		size := ""
		for _, o := range strings.Split(g[2], ",") {
			if strings.HasPrefix(o, "size=") {
				size = o
			}
		}
		out = append(out, g[1]+" "+g[0]+" "+size)
	}
	return out
}

func TestValidShmSize(t *testing.T) {
	for size, ok := range map[string]bool{"": true, "1073741824": true, "50%": true, "100%": true, "0": false, "101%": false, "1Gi": false, "-1": false, "%": false} {
		if err := mps.ValidShmSize(size); (err == nil) != ok {
			t.Errorf("ValidShmSize(%q) = %v, want ok %v", size, err, ok)
		}
	}
}
