package sim

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing/fstest"
	"time"

	"github.com/gputopo/gputopo/pkg/gpu"
)

// Backend serves a profile's GPUs for one node. Health faults come from a
// file (one GPU index or UUID per line, optionally followed by a reason)
// and from SetHealth, so tests and demos can break a GPU on purpose.
type Backend struct {
	profile    *Profile
	node       string
	healthFile string
	poll       time.Duration

	mu        sync.Mutex
	injected  map[string]gpu.HealthEvent // by UUID, from SetHealth
	reported  map[string]gpu.HealthEvent // last state sent, by UUID
	inventory *gpu.Inventory
	kick      chan struct{}

	modeDir string                     // see WithComputeModeDir
	modes   map[string]gpu.ComputeMode // by UUID, without modeDir
}

var (
	_ gpu.Backend      = (*Backend)(nil)
	_ gpu.ComputeModes = (*Backend)(nil)
)

// Option configures a Backend.
type Option func(*Backend)

// WithHealthFile makes the backend read faults from file. A missing file
// means every GPU is healthy.
func WithHealthFile(file string) Option { return func(b *Backend) { b.healthFile = file } }

// WithComputeModeDir keeps each GPU's compute mode in dir/<UUID>.compute-mode
// (absent: DEFAULT), so that it outlives the process, as a real GPU's does,
// and tests can read and change it. Without it the modes live in memory.
func WithComputeModeDir(dir string) Option { return func(b *Backend) { b.modeDir = dir } }

// WithPollInterval sets how often the health file is read.
func WithPollInterval(d time.Duration) Option { return func(b *Backend) { b.poll = d } }

// New returns a backend that simulates profile on node. The node name
// seeds the GPU UUIDs so two simulated nodes never share one.
func New(profile *Profile, node string, opts ...Option) *Backend {
	b := &Backend{
		profile:  profile,
		node:     node,
		poll:     time.Second,
		injected: map[string]gpu.HealthEvent{},
		reported: map[string]gpu.HealthEvent{},
		kick:     make(chan struct{}, 1),
		modes:    map[string]gpu.ComputeMode{},
	}
	for _, o := range opts {
		o(b)
	}
	b.inventory = profile.Inventory(node)
	return b
}

// Name implements gpu.Backend.
func (b *Backend) Name() string { return "sim" }

// Close implements gpu.Backend.
func (b *Backend) Close() error { return nil }

// Discover implements gpu.Backend.
func (b *Backend) Discover(context.Context) (*gpu.Inventory, error) {
	return b.inventory, nil
}

// ComputeModeDir is where the plugin keeps simulated GPUs' compute modes
// (WithComputeModeDir) for a --sim-dev-root: beside their device nodes.
func ComputeModeDir(simDevRoot string) string { return filepath.Join(simDevRoot, "compute-mode") }

// ComputeModeFile is where a GPU's compute mode is kept under
// WithComputeModeDir's dir.
func ComputeModeFile(dir, uuid string) string { return filepath.Join(dir, uuid+".compute-mode") }

// ComputeMode implements gpu.ComputeModes.
func (b *Backend) ComputeMode(uuid string) (gpu.ComputeMode, error) {
	if err := b.known(uuid); err != nil {
		return "", err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.modeDir == "" {
		if m, ok := b.modes[uuid]; ok {
			return m, nil
		}
		return gpu.ComputeModeDefault, nil
	}
	data, err := os.ReadFile(ComputeModeFile(b.modeDir, uuid))
	if errors.Is(err, fs.ErrNotExist) {
		return gpu.ComputeModeDefault, nil
	}
	if err != nil {
		return "", fmt.Errorf("read compute mode of simulated GPU %s: %w", uuid, err)
	}
	return gpu.ComputeMode(strings.TrimSpace(string(data))), nil
}

// SetComputeMode implements gpu.ComputeModes.
func (b *Backend) SetComputeMode(uuid string, mode gpu.ComputeMode) error {
	if err := b.known(uuid); err != nil {
		return err
	}
	switch mode {
	case gpu.ComputeModeDefault, gpu.ComputeModeExclusiveProcess, gpu.ComputeModeProhibited:
	default:
		return fmt.Errorf("set compute mode of simulated GPU %s: %q is not one NVML sets (%s, %s or %s)", uuid, mode, gpu.ComputeModeDefault, gpu.ComputeModeExclusiveProcess, gpu.ComputeModeProhibited)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.modeDir == "" {
		b.modes[uuid] = mode
		return nil
	}
	if err := os.MkdirAll(b.modeDir, 0o755); err != nil {
		return fmt.Errorf("set compute mode of simulated GPU %s: %w", uuid, err)
	}
	if err := os.WriteFile(ComputeModeFile(b.modeDir, uuid), []byte(string(mode)+"\n"), 0o644); err != nil {
		return fmt.Errorf("set compute mode of simulated GPU %s: %w", uuid, err)
	}
	return nil
}

func (b *Backend) known(uuid string) error {
	for _, d := range b.inventory.Devices {
		if d.UUID == uuid {
			return nil
		}
	}
	return fmt.Errorf("simulated GPU %s is not one of node %s's", uuid, b.node)
}

// SetHealth injects a fault (healthy=false) or clears it for GPU index.
func (b *Backend) SetHealth(index int, healthy bool, reason string) error {
	if index < 0 || index >= len(b.inventory.Devices) {
		return fmt.Errorf("set health of simulated GPU %d: the profile has GPUs 0-%d", index, len(b.inventory.Devices)-1)
	}
	uuid := b.inventory.Devices[index].UUID
	b.mu.Lock()
	if healthy {
		delete(b.injected, uuid)
	} else {
		b.injected[uuid] = gpu.HealthEvent{UUID: uuid, Reason: reason, Message: "fault injected"}
	}
	b.mu.Unlock()
	select {
	case b.kick <- struct{}{}:
	default:
	}
	return nil
}

// WatchHealth implements gpu.Backend: it sends a change whenever a GPU
// turns unhealthy or recovers.
func (b *Backend) WatchHealth(ctx context.Context, events chan<- gpu.HealthEvent) error {
	ticker := time.NewTicker(b.poll)
	defer ticker.Stop()
	select {
	case events <- gpu.HealthEvent{Watch: gpu.WatchActive}:
	case <-ctx.Done():
		return nil
	}
	for {
		for _, ev := range b.changes() {
			select {
			case events <- ev:
			case <-ctx.Done():
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		case <-b.kick:
		}
	}
}

// changes computes the health transitions since the last call.
func (b *Backend) changes() []gpu.HealthEvent {
	faults := b.readHealthFile()
	b.mu.Lock()
	defer b.mu.Unlock()
	for uuid, ev := range b.injected {
		faults[uuid] = ev
	}
	var out []gpu.HealthEvent
	for _, d := range b.inventory.Devices {
		now, bad := faults[d.UUID]
		prev, wasBad := b.reported[d.UUID]
		switch {
		case bad && (!wasBad || prev.Reason != now.Reason):
			b.reported[d.UUID] = now
			out = append(out, now)
		case !bad && wasBad:
			delete(b.reported, d.UUID)
			out = append(out, gpu.HealthEvent{UUID: d.UUID, Healthy: true, Reason: "Recovered"})
		}
	}
	return out
}

func (b *Backend) readHealthFile() map[string]gpu.HealthEvent {
	faults := map[string]gpu.HealthEvent{}
	if b.healthFile == "" {
		return faults
	}
	data, err := os.ReadFile(b.healthFile)
	if err != nil {
		return faults
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		uuid := fields[0]
		if i, err := strconv.Atoi(fields[0]); err == nil && i >= 0 && i < len(b.inventory.Devices) {
			uuid = b.inventory.Devices[i].UUID
		}
		reason := "SimulatedFault"
		if len(fields) > 1 {
			reason = fields[1]
		}
		faults[uuid] = gpu.HealthEvent{UUID: uuid, Reason: reason, Message: "listed in " + b.healthFile}
	}
	return faults
}

// Inventory builds the GPUs a node with this profile would report.
func (p *Profile) Inventory(node string) *gpu.Inventory {
	inv := &gpu.Inventory{LinkBandwidthGBps: p.LinkBandwidthGBps, SysFS: fstest.MapFS{}}
	perRoot := (p.GPUs + p.PCIeRoots - 1) / p.PCIeRoots
	perNUMA := (p.GPUs + p.NUMANodes - 1) / p.NUMANodes
	busStride := 0x100 / p.PCIeRoots
	sysfs := inv.SysFS.(fstest.MapFS)
	for i := range p.GPUs {
		root := i / perRoot
		rootBus := root * busStride
		busID := fmt.Sprintf("0000:%02x:00.0", rootBus+1+i%perRoot)
		numa := i / perNUMA
		d := gpu.Device{
			Index:                 i,
			Minor:                 i,
			UUID:                  simUUID(node, p.Name, i),
			ProductName:           p.ProductName,
			Architecture:          p.Architecture,
			CUDAComputeCapability: p.CUDAComputeCapability,
			DriverVersion:         p.DriverVersion,
			CUDADriverVersion:     p.CUDADriverVersion,
			MemoryBytes:           p.memoryBytes,
			PCIBusID:              busID,
			NUMANode:              numa,
			NVLinks:               p.NVLinksPerGPU,
		}
		if p.Fabric != nil {
			d.Fabric = &gpu.Fabric{ClusterUUID: p.Fabric.ClusterUUID, CliqueID: p.Fabric.CliqueID}
		}
		inv.Devices = append(inv.Devices, d)
		// A synthetic /sys so the standard attribute helpers resolve the
		// PCIe root and NUMA node exactly as they do on a real host.
		devPath := path.Join("devices", fmt.Sprintf("pci0000:%02x", rootBus), fmt.Sprintf("0000:%02x:01.0", rootBus), busID)
		sysfs[path.Join("bus/pci/devices", busID)] = &fstest.MapFile{Data: []byte("../../../" + devPath), Mode: os.ModeSymlink}
		sysfs[path.Join(devPath, "numa_node")] = &fstest.MapFile{Data: []byte(strconv.Itoa(numa) + "\n")}
	}
	for i := range p.NVLink {
		for j := i + 1; j < len(p.NVLink[i]); j++ {
			if c := p.NVLink[i][j]; c > 0 {
				inv.Links = append(inv.Links, gpu.Link{A: i, B: j, Count: c})
			}
		}
	}
	return inv
}

func simUUID(node, profile string, index int) string {
	h := sha256.Sum256([]byte(node + "/" + profile + "/" + strconv.Itoa(index)))
	x := fmt.Sprintf("%x", h[:16])
	return fmt.Sprintf("GPU-%s-%s-%s-%s-%s", x[0:8], x[8:12], x[12:16], x[16:20], x[20:32])
}
