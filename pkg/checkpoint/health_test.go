package checkpoint

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestHealthRoundTrip(t *testing.T) {
	s := NewHealthStore(filepath.Join(t.TempDir(), "health.json"))
	empty, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(empty.GPUs) != 0 || empty.GPUs == nil {
		t.Errorf("missing file loads as %+v, want an empty record with a map", empty)
	}
	gpus := map[string]GPUCondition{
		"GPU-1": {Reason: "XID-79", Message: "critical Xid error 79"},
		"GPU-2": {Reason: "ECC-DBE"},
	}
	if err := s.Save("boot-1", gpus); err != nil {
		t.Fatal(err)
	}
	got, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(gpus, got.GPUs); diff != "" || got.BootID != "boot-1" {
		t.Errorf("loaded boot %q, GPUs (-want +got):\n%s", got.BootID, diff)
	}
	if st, _ := os.Stat(s.Path()); st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", st.Mode().Perm())
	}
}

func TestHealthRefusesWhatItCannotTrust(t *testing.T) {
	dir := t.TempDir()
	s := NewHealthStore(filepath.Join(dir, "health.json"))
	if err := s.Save("b", map[string]GPUCondition{"GPU-1": {Reason: "XID-79"}}); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(s.Path())
	for name, c := range map[string]struct {
		data string
		want error
	}{
		"edited":  {strings.Replace(string(data), "XID-79", "XID-48", 1), ErrCorrupt},
		"garbage": {"{", ErrCorrupt},
		"future":  {strings.Replace(string(data), HealthVersion, "gputopo.dev/health/v9", 1), ErrUnsupportedVersion},
	} {
		t.Run(name, func(t *testing.T) {
			if err := os.WriteFile(s.Path(), []byte(c.data), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Load(); !errors.Is(err, c.want) {
				t.Errorf("Load = %v, want %v", err, c.want)
			}
		})
	}
}
