package cluster

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// TestRelaunch: a process the cluster started is stopped and started again
// with the same command line, options and log; a running one is not
// started twice, and one the cluster did not start is refused.
func TestRelaunch(t *testing.T) {
	dir := t.TempDir()
	work := filepath.Join(dir, "work")
	if err := os.MkdirAll(work, 0o755); err != nil {
		t.Fatal(err)
	}
	c := &Cluster{dir: dir, owner: true, procs: map[string]*proc{}}
	argv := []string{"sh", "-c", `pwd > started; exec sleep 600`}
	if err := c.launchOpts("sleeper", procOpts{workDir: work}, argv...); err != nil {
		t.Fatal(err)
	}
	first := c.procByName("sleeper")
	t.Cleanup(func() { c.procByName("sleeper").kill(5 * time.Second) })
	started := func() error {
		return wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			_, err := os.Stat(filepath.Join(work, "started"))
			return err == nil, nil
		})
	}
	if err := started(); err != nil {
		t.Fatalf("the first process did not run in its work dir: %v", err)
	}

	if err := c.relaunch("sleeper"); err == nil || !strings.Contains(err.Error(), "already running") {
		t.Errorf("relaunch of a running process: got %v, want an error saying it already runs", err)
	}
	if err := c.stopForRestart("sleeper"); err != nil {
		t.Fatal(err)
	}
	if !first.exited() {
		t.Fatal("process still running after stopForRestart")
	}
	if err := c.stopForRestart("sleeper"); !errors.Is(err, ErrNotRunning) {
		t.Errorf("stopping a stopped process: got %v, want ErrNotRunning", err)
	}
	if err := os.Remove(filepath.Join(work, "started")); err != nil {
		t.Fatal(err)
	}
	if err := c.relaunch("sleeper"); err != nil {
		t.Fatal(err)
	}
	if err := started(); err != nil {
		t.Fatalf("the relaunched process did not run in its work dir: %v", err)
	}
	second := c.procByName("sleeper")
	if second.pid == first.pid || second.exited() {
		t.Fatalf("relaunched process: pid %d (first %d), exited %v", second.pid, first.pid, second.exited())
	}
	if !slices.Equal(second.argv, argv) || second.opts.workDir != work || !second.opts.ownedByParent {
		t.Errorf("relaunched with argv %q, opts %+v; want argv %q in %s, owned by this process", second.argv, second.opts, argv, work)
	}
	if found := procFromPidFile(second.pidFile); found == nil || found.pid != second.pid {
		t.Errorf("pid file names %+v, want pid %d", found, second.pid)
	}
	log, err := os.ReadFile(second.logFile)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(log), "==== "); n != 2 {
		t.Errorf("log has %d start lines, want 2 (one log across restarts):\n%s", n, log)
	}

	if err := c.relaunch("nobody"); err == nil {
		t.Error("relaunch of a process the cluster never started succeeded")
	}
	attached := &Cluster{dir: dir, procs: map[string]*proc{}}
	if err := attached.stopForRestart("sleeper"); err == nil || !strings.Contains(err.Error(), "command line is unknown") {
		t.Errorf("an attached cluster stopping a process it cannot start again: got %v", err)
	}
}
