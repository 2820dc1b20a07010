package cluster

import (
	"os"
	"path/filepath"
	"testing"
)

// The kubelet line that StartPlugin waits for, as 1.37.1 logged it (1.36
// logs the same message and keys).
const kubeletRegisteredLine = `I1126 05:13:34.846136   24381 dra_plugin_manager.go:444] "Registered DRA plugin" logger="DRA registration handler" driverName="gpu.gputopo.dev" endpoint="/tmp/c/nodes/n0/kubelet/plugins/gpu.gputopo.dev/dra.sock" chosenService="v1.DRAPlugin" numPlugins=1
`

func TestLogHasLineSince(t *testing.T) {
	log := filepath.Join(t.TempDir(), "kubelet.log")
	other := `I1126 05:13:34.846338   24381 dra_plugin_manager.go:444] "Registered DRA plugin" logger="DRA registration handler" driverName="other.example.com"` + "\n"
	if err := os.WriteFile(log, []byte(kubeletRegisteredLine+other), 0o644); err != nil {
		t.Fatal(err)
	}
	if !logHasLineSince(log, 0, registeredLine...) {
		t.Error("the kubelet's registration line is not found")
	}
	if logHasLineSince(log, int64(len(kubeletRegisteredLine)), registeredLine...) {
		t.Error("a registration line before the offset counts, or another driver's counts")
	}
	if logHasLineSince(filepath.Join(t.TempDir(), "missing.log"), 0, registeredLine...) {
		t.Error("a missing log has the line")
	}
}
