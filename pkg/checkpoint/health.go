package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"maps"
	"os"
)

// HealthVersion identifies the on-disk schema of the health record.
const HealthVersion = "gputopo.dev/health/v1"

// GPUCondition is a GPU error that lasts until the GPU is reset: NVML
// reports Xid and ECC errors once and never their repair, so a restarted
// plugin would otherwise publish the GPU healthy again.
type GPUCondition struct {
	// Reason is the unhealthy taint's value, e.g. "XID-79".
	Reason  string `json:"reason"`
	Message string `json:"message,omitempty"`
}

// Health is the record of GPU errors that must survive a plugin restart.
// A reboot resets the GPUs, so a record from another boot is void.
type Health struct {
	Version string `json:"version"`
	BootID  string `json:"bootID,omitempty"`
	// GPUs is keyed by GPU UUID.
	GPUs map[string]GPUCondition `json:"gpus"`
	// Checksum is a CRC-32C over the canonical JSON encoding of GPUs.
	Checksum uint32 `json:"checksum"`
}

// HealthStore reads and writes the health record file.
type HealthStore struct {
	path string
}

// NewHealthStore returns a HealthStore for the file at path, whose
// directory must exist by the time Save is called.
func NewHealthStore(path string) *HealthStore { return &HealthStore{path: path} }

// Path returns the file's path.
func (s *HealthStore) Path() string { return s.path }

func healthChecksum(gpus map[string]GPUCondition) (uint32, error) {
	data, err := json.Marshal(gpus)
	if err != nil {
		return 0, fmt.Errorf("encode GPU conditions for checksum: %w", err)
	}
	return crc32.Checksum(data, crc32.MakeTable(crc32.Castagnoli)), nil
}

// Load reads the record; a missing file is an empty one. A file of another
// version fails with ErrUnsupportedVersion, anything else unreadable with
// ErrCorrupt.
func (s *HealthStore) Load() (*Health, error) {
	data, err := os.ReadFile(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		return &Health{Version: HealthVersion, GPUs: map[string]GPUCondition{}}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read GPU health record %s: %w", s.path, err)
	}
	var h Health
	if err := json.Unmarshal(data, &h); err != nil {
		return nil, fmt.Errorf("%w: decode GPU health record %s: %w", ErrCorrupt, s.path, err)
	}
	if h.Version != HealthVersion {
		return nil, fmt.Errorf("%w: GPU health record %s has version %q, this plugin reads %q", ErrUnsupportedVersion, s.path, h.Version, HealthVersion)
	}
	if h.GPUs == nil {
		h.GPUs = map[string]GPUCondition{}
	}
	sum, err := healthChecksum(h.GPUs)
	if err != nil {
		return nil, fmt.Errorf("%w: GPU health record %s: %w", ErrCorrupt, s.path, err)
	}
	if sum != h.Checksum {
		return nil, fmt.Errorf("%w: GPU health record %s checksum is %08x, content hashes to %08x", ErrCorrupt, s.path, h.Checksum, sum)
	}
	return &h, nil
}

// Save writes the record atomically, as Store.Save does.
func (s *HealthStore) Save(bootID string, gpus map[string]GPUCondition) error {
	out := Health{Version: HealthVersion, BootID: bootID, GPUs: maps.Clone(gpus)}
	if out.GPUs == nil {
		out.GPUs = map[string]GPUCondition{}
	}
	sum, err := healthChecksum(out.GPUs)
	if err != nil {
		return fmt.Errorf("save GPU health record %s: %w", s.path, err)
	}
	out.Checksum = sum
	data, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return fmt.Errorf("encode GPU health record %s: %w", s.path, err)
	}
	if err := writeFileAtomic(s.path, append(data, '\n')); err != nil {
		return fmt.Errorf("save GPU health record %s: %w", s.path, err)
	}
	return nil
}
