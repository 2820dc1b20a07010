package cluster

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

func TestProcStopAndPidFile(t *testing.T) {
	dir := t.TempDir()
	// The shell ignores SIGTERM; its child must still go with the group.
	p, err := startProc(dir, "sleeper", []string{"sh", "-c", `trap "" TERM; sleep 600 & wait`}, procOpts{workDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	found := procFromPidFile(p.pidFile)
	if found == nil || found.pid != p.pid {
		t.Fatalf("procFromPidFile = %+v, want pid %d", found, p.pid)
	}
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	found.stop(500 * time.Millisecond) // by pid file, as `down` does
	if !p.wait(5 * time.Second) {
		t.Fatal("process still running after stop")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("stop took %s", d)
	}
	if _, err := os.Stat(p.pidFile); !os.IsNotExist(err) {
		t.Errorf("pid file left behind: %v", err)
	}
	if procFromPidFile(p.pidFile) != nil {
		t.Error("stopped process still found by pid file")
	}
	if _, err := os.Stat(filepath.Join(dir, "logs", "sleeper.log")); err != nil {
		t.Errorf("log: %v", err)
	}
}

func TestProcFromStalePidFile(t *testing.T) {
	f := filepath.Join(t.TempDir(), "x.pid")
	// Our own pid with a wrong start time: a reused pid must not match.
	if err := os.WriteFile(f, []byte(itoa(os.Getpid())+" 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if p := procFromPidFile(f); p != nil {
		t.Errorf("stale pid file matched pid %d", p.pid)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
