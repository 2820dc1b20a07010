package mps_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gputopo/gputopo/pkg/mps"
	"github.com/gputopo/gputopo/pkg/mps/mpstest"
)

// TestMain lets this test binary be a daemon's launcher, as the plugin's
// is.
func TestMain(m *testing.M) {
	mps.Launch()
	os.Exit(m.Run())
}

// TestDaemonSharesShm: started through a launcher, the daemon sees its
// GPU's shm directory as /dev/shm (what it writes there lands in that
// directory, which the share's containers get as /dev/shm), and this
// process's /dev/shm is untouched.
func TestDaemonSharesShm(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("binding over /dev/shm in a mount namespace needs root")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t)
	m, err := mps.New(mps.Config{ControlPath: f.control, Root: f.root, Launcher: exe, StopTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Sync(t.Context(), nil) })
	sync(t, m, map[string]mps.Limits{gpuA: {ActiveThreadPercentage: 50}})
	pid := m.Running(gpuA)
	if pid == 0 {
		t.Fatal("no daemon runs")
	}
	data, err := os.ReadFile(filepath.Join(m.ShmDir(gpuA), mpstest.ShmMarker))
	if err != nil {
		t.Fatalf("the daemon's /dev/shm is not %s: %v", m.ShmDir(gpuA), err)
	}
	if got := strings.TrimSpace(string(data)); got != strings.TrimSpace(itoa(pid)) {
		t.Errorf("%s in the shm directory names pid %s, want the daemon's %d", mpstest.ShmMarker, got, pid)
	}
	if data, err := os.ReadFile(filepath.Join("/dev/shm", mpstest.ShmMarker)); err == nil && strings.TrimSpace(string(data)) == itoa(pid) {
		t.Errorf("the daemon wrote into this process's /dev/shm")
	}
	if !m.SharesShm() {
		t.Error("SharesShm = false with a launcher")
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
