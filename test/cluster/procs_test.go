package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
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
	// Stop only once the shell ignores SIGTERM and its child runs.
	err = wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return ignoresSIGTERM(t, p.pid) && len(groupMembers(t, p.pid)) == 2, nil
	})
	if err != nil {
		t.Fatalf("wait for shell %d to ignore SIGTERM and start its child: %v", p.pid, err)
	}
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

// ignoresSIGTERM reads the ignored-signal mask of pid.
func ignoresSIGTERM(t *testing.T, pid int) bool {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("read status of pid %d: %v", pid, err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if mask, ok := strings.CutPrefix(line, "SigIgn:"); ok {
			bits, err := strconv.ParseUint(strings.TrimSpace(mask), 16, 64)
			return err == nil && bits&(1<<(uint(syscall.SIGTERM)-1)) != 0
		}
	}
	return false
}

// groupMembers returns the live processes of process group pgid.
func groupMembers(t *testing.T, pgid int) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !alive(pid) {
			continue
		}
		if g, err := syscall.Getpgid(pid); err == nil && g == pgid {
			pids = append(pids, pid)
		}
	}
	return pids
}

func itoa(i int) string { return strconv.Itoa(i) }
