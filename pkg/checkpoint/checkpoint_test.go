package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func sample() *Checkpoint {
	cp := New()
	cp.Claims["uid-a"] = ClaimState{
		UID: "uid-a", Namespace: "ns", Name: "claim-a", State: PrepareCompleted,
		Devices: []PreparedDevice{
			{Request: "gpus", Pool: "node-1", Device: "gpu-0", UUID: "GPU-0000", CDIDeviceIDs: []string{"gputopo.dev/gpu=uid-a-gpu-0"}},
			{Request: "gpus/h100", Pool: "node-1", Device: "gpu-1", UUID: "GPU-1111", CDIDeviceIDs: []string{"gputopo.dev/gpu=uid-a-gpu-1"}},
		},
	}
	cp.Claims["uid-b"] = ClaimState{
		UID: "uid-b", Namespace: "ns", Name: "claim-b", State: PrepareStarted,
		Devices: []PreparedDevice{{Request: "gpu", Pool: "node-1", Device: "gpu-5", UUID: "GPU-5555"}},
	}
	cp.Claims["uid-c"] = ClaimState{
		UID: "uid-c", Namespace: "monitoring", Name: "dcgm", State: PrepareCompleted,
		Devices: []PreparedDevice{{Request: "all", Pool: "node-1", Device: "gpu-7", UUID: "GPU-7777", AdminAccess: true}},
	}
	cp.BootID = "9f3c1e2a-5b6d-4c7e-8f90-a1b2c3d4e5f6"
	return cp
}

func newTestStore(t *testing.T) *Store {
	t.Helper()
	return NewStore(filepath.Join(t.TempDir(), "checkpoint.json"))
}

func TestRoundTrip(t *testing.T) {
	s := newTestStore(t)
	want := sample()
	if err := s.Save(want); err != nil {
		t.Fatalf("Save: %v", err)
	}
	got, err := s.Load()
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	// Save stamps the checksum on the written copy only.
	if diff := cmp.Diff(want, got, cmpIgnoreChecksum); diff != "" {
		t.Errorf("Load after Save (-want +got):\n%s", diff)
	}
	if got.Checksum == 0 {
		t.Errorf("loaded checksum is zero, want the stored CRC")
	}

	st, err := os.Stat(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	if perm := st.Mode().Perm(); perm != 0o600 {
		t.Errorf("checkpoint mode = %o, want 600", perm)
	}
}

var cmpIgnoreChecksum = cmp.FilterPath(func(p cmp.Path) bool {
	return p.String() == "Checksum"
}, cmp.Ignore())

func TestSaveIsDeterministic(t *testing.T) {
	s := newTestStore(t)
	if err := s.Save(sample()); err != nil {
		t.Fatal(err)
	}
	first, err := os.ReadFile(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if err := s.Save(sample()); err != nil {
			t.Fatal(err)
		}
		again, err := os.ReadFile(s.Path())
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(string(first), string(again)); diff != "" {
			t.Fatalf("re-saving the same checkpoint changed the file (-first +again):\n%s", diff)
		}
	}
}

func TestLoadMissingFile(t *testing.T) {
	got, err := newTestStore(t).Load()
	if err != nil {
		t.Fatalf("Load of missing file: %v", err)
	}
	if diff := cmp.Diff(New(), got); diff != "" {
		t.Errorf("Load of missing file (-want +got):\n%s", diff)
	}
}

func TestLoadCorrupt(t *testing.T) {
	valid := func(t *testing.T) []byte {
		s := newTestStore(t)
		if err := s.Save(sample()); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(s.Path())
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	tests := map[string]func(t *testing.T) []byte{
		"empty":      func(*testing.T) []byte { return nil },
		"garbage":    func(*testing.T) []byte { return []byte("\x00\x01not json") },
		"truncated":  func(t *testing.T) []byte { d := valid(t); return d[:len(d)/2] },
		"no version": func(*testing.T) []byte { return []byte(`{"claims":{}}`) },
		"wrong type": func(*testing.T) []byte { return []byte(`{"version":"` + Version + `","claims":[]}`) },
		"hand edited": func(t *testing.T) []byte {
			return bytes.Replace(valid(t), []byte("GPU-5555"), []byte("GPU-6666"), 1)
		},
		"bad checksum": func(*testing.T) []byte {
			return []byte(`{"version":"` + Version + `","claims":{},"checksum":1}`)
		},
		"key mismatch": func(t *testing.T) []byte {
			return withValidChecksum(t, map[string]ClaimState{"k": {UID: "other", State: PrepareStarted}})
		},
		"unknown state": func(t *testing.T) []byte {
			return withValidChecksum(t, map[string]ClaimState{"k": {UID: "k", State: "Prepared"}})
		},
	}
	for name, content := range tests {
		t.Run(name, func(t *testing.T) {
			s := newTestStore(t)
			if err := os.WriteFile(s.Path(), content(t), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := s.Load()
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Load() error = %v, want ErrCorrupt", err)
			}
		})
	}
}

// withValidChecksum encodes claims with a correct checksum, bypassing the
// validation Save would do, to exercise Load's own consistency checks.
func withValidChecksum(t *testing.T, claims map[string]ClaimState) []byte {
	t.Helper()
	sum, err := checksum(claims)
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(Checkpoint{Version: Version, Claims: claims, Checksum: sum})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestLoadIgnoresFormatting(t *testing.T) {
	// The checksum is over content, not bytes: re-indenting is not damage.
	s := newTestStore(t)
	if err := s.Save(sample()); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, data); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.Path(), compact.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(); err != nil {
		t.Errorf("Load of compacted file: %v", err)
	}
}

func TestLoadWrongVersion(t *testing.T) {
	s := newTestStore(t)
	// A future schema may change field types too; the version must still
	// be what gets reported.
	data := `{"version":"gputopo.dev/checkpoint/v2","claims":{"x":{"devices":"new-shape"}}}`
	if err := os.WriteFile(s.Path(), []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := s.Load()
	if !errors.Is(err, ErrUnsupportedVersion) {
		t.Fatalf("Load() error = %v, want ErrUnsupportedVersion", err)
	}
	if errors.Is(err, ErrCorrupt) {
		t.Errorf("Load() error = %v, must not also be ErrCorrupt", err)
	}
	for _, want := range []string{"gputopo.dev/checkpoint/v2", Version} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Load() error %q does not name %q", err, want)
		}
	}
}

func TestSaveRejectsInconsistentCheckpoint(t *testing.T) {
	s := newTestStore(t)
	cp := New()
	cp.Claims["a"] = ClaimState{UID: "b", State: PrepareStarted}
	if err := s.Save(cp); err == nil {
		t.Fatal("Save of claim keyed under the wrong UID succeeded")
	}
	if _, err := os.Stat(s.Path()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("rejected Save left a file behind: stat error %v", err)
	}
}

func TestSaveDoesNotModifyInput(t *testing.T) {
	cp := sample()
	cp.Version = ""
	want := cp.Clone()
	if err := newTestStore(t).Save(cp); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, cp); diff != "" {
		t.Errorf("Save modified its argument (-before +after):\n%s", diff)
	}
}

func TestClone(t *testing.T) {
	orig := sample()
	c := orig.Clone()
	if diff := cmp.Diff(orig, c); diff != "" {
		t.Fatalf("Clone differs (-orig +clone):\n%s", diff)
	}
	c.Claims["uid-a"].Devices[0].CDIDeviceIDs[0] = "changed"
	c.Claims["uid-a"].Devices[1].UUID = "changed"
	delete(c.Claims, "uid-b")
	if diff := cmp.Diff(sample(), orig); diff != "" {
		t.Errorf("mutating the clone changed the original (-want +got):\n%s", diff)
	}
}

func TestDeviceOwner(t *testing.T) {
	cp := sample()
	tests := []struct {
		pool, device string
		wantUID      string
		wantOK       bool
	}{
		{"node-1", "gpu-0", "uid-a", true},
		{"node-1", "gpu-1", "uid-a", true},
		{"node-1", "gpu-5", "uid-b", true}, // PrepareStarted still owns it
		{"node-1", "gpu-2", "", false},
		{"node-1", "gpu-7", "", false}, // admin access holds nothing
		{"node-2", "gpu-0", "", false},
	}
	for _, tt := range tests {
		uid, ok := cp.DeviceOwner(tt.pool, tt.device)
		if uid != tt.wantUID || ok != tt.wantOK {
			t.Errorf("DeviceOwner(%q, %q) = %q, %v; want %q, %v",
				tt.pool, tt.device, uid, ok, tt.wantUID, tt.wantOK)
		}
	}
}
