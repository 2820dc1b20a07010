package checkpoint

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func FuzzLoad(f *testing.F) {
	seed := newSeedStore(f)
	if err := seed.Save(sample()); err != nil {
		f.Fatal(err)
	}
	valid, err := os.ReadFile(seed.Path())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(valid)
	f.Add([]byte(`{"version":"` + Version + `","claims":{},"checksum":0}`))
	f.Add([]byte(`{"version":"` + Version + `","claims":null,"checksum":0}`))
	f.Add([]byte(`{"version":"gputopo.dev/checkpoint/v0"}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`[]`))
	f.Add([]byte{})

	f.Fuzz(func(t *testing.T, data []byte) {
		s := newTestStore(t)
		if err := os.WriteFile(s.Path(), data, 0o600); err != nil {
			t.Fatal(err)
		}
		cp, err := s.Load()
		if err != nil {
			return
		}
		// Anything Load accepts must survive a Save/Load round trip
		// unchanged, or a restart would silently alter plugin state.
		if err := s.Save(cp); err != nil {
			t.Fatalf("Save of loaded checkpoint: %v", err)
		}
		again, err := s.Load()
		if err != nil {
			t.Fatalf("Load after re-Save: %v", err)
		}
		if diff := cmp.Diff(cp, again); diff != "" {
			t.Errorf("round trip changed the checkpoint (-loaded +reloaded):\n%s", diff)
		}
	})
}

func newSeedStore(f *testing.F) *Store {
	return NewStore(filepath.Join(f.TempDir(), "checkpoint.json"))
}
