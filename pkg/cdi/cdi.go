// Package cdi writes the Container Device Interface spec files through which
// the container runtime exposes a prepared claim's GPUs to its containers.
//
// Each claim gets its own transient spec file, named after the claim UID, so
// that unpreparing a claim is a single file removal and claims never share
// (or race on) a file. CDI device names are prefixed with the claim UID,
// which keeps fully-qualified IDs unique on the node even when two claims
// over time use the same slice device.
package cdi

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

const (
	// Vendor and Class form the CDI kind "gputopo.dev/gpu".
	Vendor = "gputopo.dev"
	Class  = "gpu"

	// VisibleDevicesEnv is set on the claim to the comma-separated UUIDs of
	// its GPUs; the NVIDIA container toolkit and CUDA honour it.
	VisibleDevicesEnv = "NVIDIA_VISIBLE_DEVICES"

	// deviceEnvPrefix starts the per-device variable, see DeviceEnvName.
	deviceEnvPrefix = "GPUTOPO_DEVICE_"
)

// Writer creates and removes per-claim CDI spec files in one directory.
type Writer struct {
	root string
	// cache is used only for its WriteSpec/RemoveSpec: they validate the
	// spec and write it via a temporary file and rename, so a runtime
	// never reads half a spec. Auto-refresh is off because nothing here
	// reads devices back, and a directory watch would leak a goroutine.
	cache *cdiapi.Cache
}

// DeviceEdits describes one GPU of a claim.
type DeviceEdits struct {
	// Name is the device name in the ResourceSlice, e.g. "gpu-3".
	Name string
	UUID string
	// Edits give a container this GPU (its device nodes); nil for
	// simulated GPUs.
	Edits *cdispec.ContainerEdits
	// Env is set in containers that get this device. Keys must be unique
	// to the device (see DeviceEnv), so that the variables of several
	// claims in one container never replace each other.
	Env map[string]string
}

// ClaimSpec is everything needed to write one claim's CDI spec.
type ClaimSpec struct {
	ClaimUID string
	Devices  []DeviceEdits
	// Env is placement information added to every container that gets any
	// device of the claim, e.g. GPUTOPO_NVLINK_DOMAIN, GPUTOPO_LEAF.
	Env map[string]string
	// Driver are the driver edits every container with a real GPU needs
	// (DriverEdits.Common). nil for simulated GPUs, whose spec instead
	// sets NVIDIA_VISIBLE_DEVICES to the claim's UUIDs.
	Driver *cdispec.ContainerEdits
}

// NewWriter returns a Writer for the spec directory root (e.g.
// /var/run/cdi), creating the directory if needed.
func NewWriter(root string) (*Writer, error) {
	if root == "" {
		return nil, errors.New("create CDI writer: empty spec directory")
	}
	// 0755 because the container runtime, not only this plugin, reads it.
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("create CDI spec directory %s: %w", root, err)
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(root), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("create CDI cache for %s: %w", root, err)
	}
	return &Writer{root: filepath.Clean(root), cache: cache}, nil
}

// specName is the file name (with extension, so the library writes JSON)
// of a claim's spec.
func specName(claimUID string) string {
	return cdiapi.GenerateTransientSpecName(Vendor, Class, claimUID) + ".json"
}

// SpecPath returns where the spec file of claimUID lives.
func (w *Writer) SpecPath(claimUID string) string {
	return filepath.Join(w.root, specName(claimUID))
}

// DeviceName returns the CDI device name (without vendor/class) used for a
// slice device of a claim.
func DeviceName(claimUID, device string) string {
	return claimUID + "-" + device
}

// DeviceID returns the fully-qualified CDI device ID for a slice device of a
// claim, e.g. "gputopo.dev/gpu=<claimUID>-gpu-3".
func DeviceID(claimUID, device string) string {
	return parser.QualifiedName(Vendor, Class, DeviceName(claimUID, device))
}

// DeviceEnvName returns the per-device variable that carries a GPU's UUID,
// e.g. GPUTOPO_DEVICE_GPU_3 for "gpu-3". It exists because CDI rejects a
// device with no edits at all, which a simulated GPU (no device nodes) would
// otherwise be, and it lets a workload map slice device names to UUIDs.
func DeviceEnvName(device string) string {
	return DeviceEnv(strings.TrimSuffix(deviceEnvPrefix, "_"), device)
}

// DeviceEnv names a per-device variable: prefix, "_", and the device name
// in upper case with anything but letters and digits turned into "_", e.g.
// GPUTOPO_NVLINK_DOMAIN_GPU_3 for ("GPUTOPO_NVLINK_DOMAIN", "gpu-3").
func DeviceEnv(prefix, device string) string {
	var b strings.Builder
	b.WriteString(prefix)
	b.WriteByte('_')
	for _, r := range strings.ToUpper(device) {
		if (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

// WriteClaimSpec writes (or rewrites) the spec of a claim and returns, for
// each slice device name, the fully-qualified CDI device IDs to hand to the
// kubelet. Writing the same ClaimSpec again yields a byte-identical file and
// the same IDs, so a retried prepare is harmless.
func (w *Writer) WriteClaimSpec(spec ClaimSpec) (map[string][]string, error) {
	raw, ids, err := buildSpec(spec)
	if err != nil {
		return nil, fmt.Errorf("build CDI spec for claim %s: %w", spec.ClaimUID, err)
	}
	if err := w.cache.WriteSpec(raw, specName(spec.ClaimUID)); err != nil {
		return nil, fmt.Errorf("write CDI spec for claim %s: %w", spec.ClaimUID, err)
	}
	return ids, nil
}

// RemoveClaimSpec deletes the spec of a claim. A missing file is not an
// error, so a retried unprepare is harmless.
func (w *Writer) RemoveClaimSpec(claimUID string) error {
	if claimUID == "" {
		return errors.New("remove CDI spec: empty claim UID")
	}
	if err := w.cache.RemoveSpec(specName(claimUID)); err != nil {
		return fmt.Errorf("remove CDI spec for claim %s: %w", claimUID, err)
	}
	return nil
}

// buildSpec turns a ClaimSpec into a CDI spec. All ordering is derived from
// sorted names, never from input or map order, so the output is
// deterministic.
func buildSpec(spec ClaimSpec) (*cdispec.Spec, map[string][]string, error) {
	if spec.ClaimUID == "" {
		return nil, nil, errors.New("empty claim UID")
	}
	if len(spec.Devices) == 0 {
		return nil, nil, errors.New("no devices")
	}
	devs := slices.Clone(spec.Devices)
	slices.SortFunc(devs, func(a, b DeviceEdits) int { return cmp.Compare(a.Name, b.Name) })

	raw := &cdispec.Spec{Kind: Vendor + "/" + Class}
	ids := make(map[string][]string, len(devs))
	uuids := make([]string, 0, len(devs))
	for i, d := range devs {
		if d.Name == "" {
			return nil, nil, errors.New("device with empty name")
		}
		if i > 0 && devs[i-1].Name == d.Name {
			return nil, nil, fmt.Errorf("device %s listed twice", d.Name)
		}
		// A comma would split the UUID list in NVIDIA_VISIBLE_DEVICES.
		if d.UUID == "" || strings.Contains(d.UUID, ",") {
			return nil, nil, fmt.Errorf("device %s: invalid UUID %q", d.Name, d.UUID)
		}
		name := DeviceName(spec.ClaimUID, d.Name)
		if err := parser.ValidateDeviceName(name); err != nil {
			return nil, nil, fmt.Errorf("device %s: %w", d.Name, err)
		}
		suffix := strings.TrimPrefix(DeviceEnvName(d.Name), deviceEnvPrefix)
		env := []string{DeviceEnvName(d.Name) + "=" + d.UUID}
		for _, k := range slices.Sorted(maps.Keys(d.Env)) {
			if !strings.HasSuffix(k, "_"+suffix) || strings.HasPrefix(k, deviceEnvPrefix) {
				return nil, nil, fmt.Errorf("device %s: variable %s is not named for the device (want <PREFIX>_%s)", d.Name, k, suffix)
			}
			env = append(env, k+"="+d.Env[k])
		}
		edits, err := cloneEdits(d.Edits)
		if err != nil {
			return nil, nil, fmt.Errorf("device %s: %w", d.Name, err)
		}
		edits.Env = append(edits.Env, env...)
		raw.Devices = append(raw.Devices, cdispec.Device{Name: name, ContainerEdits: *edits})
		ids[d.Name] = []string{DeviceID(spec.ClaimUID, d.Name)}
		uuids = append(uuids, d.UUID)
	}

	// Simulated GPUs are named by the variable; a real GPU is given by
	// its device nodes, and the driver edits set the variable to "void"
	// as NVIDIA's tools do, so that a legacy NVIDIA runtime injects
	// nothing more and several claims in one container all keep theirs.
	var env []string
	if spec.Driver == nil {
		env = append(env, VisibleDevicesEnv+"="+strings.Join(uuids, ","))
	}
	for _, k := range slices.Sorted(maps.Keys(spec.Env)) {
		switch {
		case k == "" || strings.Contains(k, "="):
			return nil, nil, fmt.Errorf("invalid environment variable name %q", k)
		case k == VisibleDevicesEnv || strings.HasPrefix(k, deviceEnvPrefix):
			return nil, nil, fmt.Errorf("environment variable %s is set by the CDI writer itself", k)
		}
		env = append(env, k+"="+spec.Env[k])
	}
	common, err := cloneEdits(spec.Driver)
	if err != nil {
		return nil, nil, fmt.Errorf("driver: %w", err)
	}
	common.Env = append(common.Env, env...)
	raw.ContainerEdits = *common

	// Declare the oldest CDI version that can express this spec, so older
	// runtimes accept it.
	v, err := cdispec.MinimumRequiredVersion(raw)
	if err != nil {
		return nil, nil, fmt.Errorf("determine CDI spec version: %w", err)
	}
	raw.Version = v
	return raw, ids, nil
}

// cloneEdits deep-copies e (nil gives empty edits), so specs never share
// slices with the cached driver edits they are built from.
func cloneEdits(e *cdispec.ContainerEdits) (*cdispec.ContainerEdits, error) {
	if e == nil {
		return &cdispec.ContainerEdits{}, nil
	}
	data, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("copy container edits: %w", err)
	}
	var out cdispec.ContainerEdits
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, fmt.Errorf("copy container edits: %w", err)
	}
	return &out, nil
}
