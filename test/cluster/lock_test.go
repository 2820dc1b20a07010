package cluster_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// needClusterBinaries returns $GPUTOPO_K8S_BIN, where `localcluster build`
// put the Kubernetes binaries, and takes the machine-wide local-cluster lock
// for the rest of the test. It skips the test when GPUTOPO_K8S_BIN is unset
// or empty (`make unit`), so only `make e2e` starts clusters.
func needClusterBinaries(t *testing.T) string {
	t.Helper()
	binDir := os.Getenv("GPUTOPO_K8S_BIN")
	if binDir == "" {
		t.Skip("GPUTOPO_K8S_BIN not set")
	}
	if _, err := os.Stat(filepath.Join(binDir, "kubelet")); err != nil {
		t.Fatalf("GPUTOPO_K8S_BIN is set, but has no Kubernetes binaries (localcluster build): %v", err)
	}
	lockLocalClusters(t)
	return binDir
}

// lockLocalClusters takes the lock $TMPDIR/gputopo-e2e.lock that the e2e
// suites and `make bench-scale` hold while they run a cluster, waiting for
// the holder, and releases it when the test ends. The kernel drops it if the
// test process dies.
func lockLocalClusters(t *testing.T) {
	t.Helper()
	path := filepath.Join(os.TempDir(), "gputopo-e2e.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatalf("open local-cluster lock: %v", err)
	}
	t.Cleanup(func() { f.Close() })
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); errors.Is(err, syscall.EWOULDBLOCK) {
		holder, _ := os.ReadFile(path)
		t.Logf("another local cluster holds %s (last taken by: %s); waiting for it", path, strings.TrimSpace(string(holder)))
		start := time.Now()
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
			t.Fatalf("lock %s: %v", path, err)
		}
		t.Logf("waited %s for the local-cluster lock", time.Since(start).Round(time.Second))
	} else if err != nil {
		t.Fatalf("lock %s: %v", path, err)
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(fmt.Sprintf("test/cluster %s, pid %d", t.Name(), os.Getpid())), 0)
}
