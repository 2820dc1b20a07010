package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Store reads and writes a checkpoint file. It does no locking of its own:
// the plugin serialises prepare/unprepare, and each Save is atomic anyway,
// so concurrent Saves can only lose an update, never tear the file.
type Store struct {
	path string
}

// NewStore returns a Store for the checkpoint file at path. The file need
// not exist yet; its directory must exist by the time Save is called.
func NewStore(path string) *Store {
	return &Store{path: path}
}

// Path returns the checkpoint file path.
func (s *Store) Path() string { return s.path }

// Hooks replaced by tests to inject failures at the points where a crash or
// I/O error matters for atomicity.
var (
	renameFile = os.Rename
	syncFile   = (*os.File).Sync
)

// Load reads the checkpoint. A missing file yields an empty checkpoint (first
// start on this node). A file of another version fails with
// ErrUnsupportedVersion; anything unreadable or inconsistent fails with
// ErrCorrupt.
func (s *Store) Load() (*Checkpoint, error) {
	data, err := os.ReadFile(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		return New(), nil
	}
	if err != nil {
		return nil, fmt.Errorf("read checkpoint %s: %w", s.path, err)
	}
	return decode(s.path, data)
}

func decode(path string, data []byte) (*Checkpoint, error) {
	// Decode the version alone first so that a file from a future schema is
	// reported as a version problem, not as a confusing field type error.
	var header struct {
		Version *string `json:"version"`
	}
	if err := json.Unmarshal(data, &header); err != nil {
		return nil, fmt.Errorf("%w: decode checkpoint %s: %w", ErrCorrupt, path, err)
	}
	if header.Version == nil {
		return nil, fmt.Errorf("%w: checkpoint %s has no version field", ErrCorrupt, path)
	}
	if *header.Version != Version {
		return nil, fmt.Errorf("%w: checkpoint %s has version %q, this plugin reads %q",
			ErrUnsupportedVersion, path, *header.Version, Version)
	}

	var cp Checkpoint
	if err := json.Unmarshal(data, &cp); err != nil {
		return nil, fmt.Errorf("%w: decode checkpoint %s: %w", ErrCorrupt, path, err)
	}
	if cp.Claims == nil {
		// Callers add claims directly; never hand them a nil map.
		cp.Claims = map[string]ClaimState{}
	}
	sum, err := checksum(cp.Claims)
	if err != nil {
		return nil, fmt.Errorf("%w: checkpoint %s: %w", ErrCorrupt, path, err)
	}
	if sum != cp.Checksum {
		return nil, fmt.Errorf("%w: checkpoint %s checksum is %08x, content hashes to %08x",
			ErrCorrupt, path, cp.Checksum, sum)
	}
	if err := cp.validate(); err != nil {
		return nil, fmt.Errorf("%w: checkpoint %s: %w", ErrCorrupt, path, err)
	}
	return &cp, nil
}

// Save writes cp atomically: a reader (or a plugin restarting after a crash)
// sees either the previous file or the new one, never a mix. The version and
// checksum are set on the written copy; cp itself is not modified.
func (s *Store) Save(cp *Checkpoint) error {
	out := Checkpoint{Version: Version, BootID: cp.BootID, Claims: cp.Claims}
	if out.Claims == nil {
		out.Claims = map[string]ClaimState{}
	}
	if err := out.validate(); err != nil {
		return fmt.Errorf("save checkpoint %s: %w", s.path, err)
	}
	sum, err := checksum(out.Claims)
	if err != nil {
		return fmt.Errorf("save checkpoint %s: %w", s.path, err)
	}
	out.Checksum = sum
	data, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return fmt.Errorf("encode checkpoint %s: %w", s.path, err)
	}
	data = append(data, '\n')
	if err := writeFileAtomic(s.path, data); err != nil {
		return fmt.Errorf("save checkpoint %s: %w", s.path, err)
	}
	return nil
}

// writeFileAtomic writes data to a temporary file in the target directory
// (rename is only atomic within one filesystem), fsyncs it so the data is
// durable before it becomes visible, renames it over path, and fsyncs the
// directory so the rename itself survives a power loss.
func writeFileAtomic(path string, data []byte) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("create temporary file: %w", err)
	}
	tmpName := tmp.Name()
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmpName)
		}
	}()
	// CreateTemp already uses 0600, but say so explicitly: the file names
	// pods and claims and has no business being world-readable.
	if err := tmp.Chmod(0o600); err != nil {
		return fmt.Errorf("chmod temporary file: %w", err)
	}
	if _, err := tmp.Write(data); err != nil {
		return fmt.Errorf("write temporary file: %w", err)
	}
	if err := syncFile(tmp); err != nil {
		return fmt.Errorf("sync temporary file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close temporary file: %w", err)
	}
	if err := renameFile(tmpName, path); err != nil {
		return fmt.Errorf("rename temporary file into place: %w", err)
	}
	if err := syncDir(dir); err != nil {
		// The new content is already visible; only durability is in doubt.
		// Report it so the caller does not acknowledge the change as safe.
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	if err := d.Sync(); err != nil {
		_ = d.Close()
		return err
	}
	return d.Close()
}
