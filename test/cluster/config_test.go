package cluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeBinDir holds empty files named like the Kubernetes binaries, enough
// for Validate.
func fakeBinDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, b := range Binaries {
		if err := os.WriteFile(filepath.Join(dir, b.Name), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestValidateExtraArgs(t *testing.T) {
	bin := fakeBinDir(t)
	ok := Config{Dir: t.TempDir(), BinDir: bin, ExtraArgs: map[string][]string{
		"kube-apiserver": {"--max-requests-inflight=800"},
		"kube-scheduler": {"--kube-api-qps=500"},
	}}
	if err := ok.Validate(); err != nil {
		t.Errorf("Validate(control plane ExtraArgs) = %v, want nil", err)
	}
	bad := Config{Dir: t.TempDir(), BinDir: bin, ExtraArgs: map[string][]string{"kubelet": {"--v=4"}}}
	err := bad.Validate()
	if err == nil || !strings.Contains(err.Error(), `"kubelet"`) || !strings.Contains(err.Error(), "kube-scheduler") {
		t.Errorf("Validate(ExtraArgs for kubelet) = %v, want an error naming kubelet and the processes that take extra arguments", err)
	}
}
