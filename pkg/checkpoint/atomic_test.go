package checkpoint

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// dirEntries lists the names in dir, to spot leftover temporary files.
func dirEntries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// savedOld writes sample() and returns the store and the file's bytes.
func savedOld(t *testing.T) (*Store, []byte) {
	t.Helper()
	s := newTestStore(t)
	if err := s.Save(sample()); err != nil {
		t.Fatal(err)
	}
	old, err := os.ReadFile(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	return s, old
}

func assertOldIntact(t *testing.T, s *Store, old []byte) {
	t.Helper()
	now, err := os.ReadFile(s.Path())
	if err != nil {
		t.Fatalf("old checkpoint unreadable after failed Save: %v", err)
	}
	if diff := cmp.Diff(string(old), string(now)); diff != "" {
		t.Errorf("failed Save changed the checkpoint (-old +now):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"checkpoint.json"}, dirEntries(t, filepath.Dir(s.Path()))); diff != "" {
		t.Errorf("directory after failed Save (-want +got):\n%s", diff)
	}
}

func TestSaveLeavesNoTempFiles(t *testing.T) {
	s := newTestStore(t)
	for i := range 3 {
		cp := sample()
		cp.Claims["uid-a"] = ClaimState{UID: "uid-a", State: PrepareStarted, Name: string(rune('a' + i))}
		if err := s.Save(cp); err != nil {
			t.Fatal(err)
		}
	}
	if diff := cmp.Diff([]string{"checkpoint.json"}, dirEntries(t, filepath.Dir(s.Path()))); diff != "" {
		t.Errorf("directory after Saves (-want +got):\n%s", diff)
	}
}

func TestFailedSaveKeepsOldFile(t *testing.T) {
	injected := errors.New("injected failure")
	tests := map[string]func(t *testing.T){
		"sync fails": func(t *testing.T) {
			orig := syncFile
			syncFile = func(*os.File) error { return injected }
			t.Cleanup(func() { syncFile = orig })
		},
		"rename fails": func(t *testing.T) {
			orig := renameFile
			renameFile = func(string, string) error { return injected }
			t.Cleanup(func() { renameFile = orig })
		},
	}
	for name, inject := range tests {
		t.Run(name, func(t *testing.T) {
			s, old := savedOld(t)
			inject(t)
			cp := sample()
			delete(cp.Claims, "uid-a")
			err := s.Save(cp)
			if !errors.Is(err, injected) {
				t.Fatalf("Save() error = %v, want the injected failure", err)
			}
			assertOldIntact(t, s, old)
		})
	}
}

func TestSaveIntoReadOnlyDir(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root ignores directory permissions")
	}
	s, old := savedOld(t)
	dir := filepath.Dir(s.Path())
	if err := os.Chmod(dir, 0o500); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Chmod(dir, 0o700) })
	if err := s.Save(New()); !errors.Is(err, os.ErrPermission) {
		t.Fatalf("Save() error = %v, want permission error", err)
	}
	assertOldIntact(t, s, old)
}

func TestSaveOverDirectory(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "checkpoint.json")
	// A non-empty directory in the way cannot be replaced by rename.
	if err := os.MkdirAll(filepath.Join(path, "child"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := NewStore(path).Save(sample()); err == nil {
		t.Fatal("Save over a directory succeeded")
	}
	if diff := cmp.Diff([]string{"checkpoint.json"}, dirEntries(t, dir)); diff != "" {
		t.Errorf("directory after failed Save (-want +got):\n%s", diff)
	}
	if _, err := os.Stat(filepath.Join(path, "child")); err != nil {
		t.Errorf("failed Save disturbed the directory in the way: %v", err)
	}
}

func TestSaveMissingDirectory(t *testing.T) {
	s := NewStore(filepath.Join(t.TempDir(), "absent", "checkpoint.json"))
	if err := s.Save(sample()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Save() error = %v, want ErrNotExist", err)
	}
}
