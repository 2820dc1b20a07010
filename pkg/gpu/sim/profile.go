// Package sim is the simulated discovery backend: GPU nodes described as
// data (YAML profiles), used by tests, the local demo and kind.
package sim

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"regexp"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"
)

//go:embed profiles/*.yaml
var builtin embed.FS

// Profile describes one simulated GPU node model.
type Profile struct {
	Name                  string `json:"name"`
	ProductName           string `json:"productName"`
	Architecture          string `json:"architecture"`
	CUDAComputeCapability string `json:"cudaComputeCapability"`
	DriverVersion         string `json:"driverVersion"`
	CUDADriverVersion     string `json:"cudaDriverVersion"`
	// Memory per GPU as a Kubernetes quantity, e.g. "80Gi".
	Memory            string  `json:"memory"`
	LinkBandwidthGBps float64 `json:"linkBandwidthGBps"`
	GPUs              int     `json:"gpus"`
	// NUMANodes and PCIeRoots split the GPUs into equal consecutive groups.
	NUMANodes int `json:"numaNodes"`
	PCIeRoots int `json:"pcieRoots"`
	// NVLink is the symmetric matrix of NVLink lanes between GPU pairs;
	// omitted when the node has no NVLink.
	NVLink [][]int `json:"nvlink,omitempty"`
	// NVLinksPerGPU is each GPU's own count of active NVLink links, for
	// NVSwitch systems where the matrix joins every pair with the same
	// links; 0 counts the matrix row.
	NVLinksPerGPU int `json:"nvlinksPerGPU,omitempty"`
	// Fabric makes every GPU part of a multi-node NVLink partition.
	Fabric *FabricSpec `json:"fabric,omitempty"`

	memoryBytes int64
}

// FabricSpec is a simulated NVLink fabric partition.
type FabricSpec struct {
	ClusterUUID string `json:"clusterUUID"`
	CliqueID    uint32 `json:"cliqueID"`
}

// ErrUnknownProfile is returned for a profile name that is not built in.
var ErrUnknownProfile = errors.New("unknown simulated GPU profile")

var (
	nameRE    = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	versionRE = regexp.MustCompile(`^[0-9]+(\.[0-9]+){1,2}$`)
)

// maxGPUs bounds a profile; no real node has more GPUs than this.
const maxGPUs = 64

// Builtin lists the names of the profiles shipped with gputopo.
func Builtin() []string {
	entries, _ := fs.ReadDir(builtin, "profiles")
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, strings.TrimSuffix(e.Name(), ".yaml"))
	}
	sort.Strings(names)
	return names
}

// LoadBuiltin returns a shipped profile by name.
func LoadBuiltin(name string) (*Profile, error) {
	data, err := builtin.ReadFile(path.Join("profiles", name+".yaml"))
	if err != nil {
		return nil, fmt.Errorf("%w %q: choose one of %s, or pass a file of your own", ErrUnknownProfile, name, strings.Join(Builtin(), ", "))
	}
	return ParseProfile(data)
}

// LoadFile reads a profile from a YAML file.
func LoadFile(file string) (*Profile, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read GPU profile: %w", err)
	}
	p, err := ParseProfile(data)
	if err != nil {
		return nil, fmt.Errorf("GPU profile %s: %w", file, err)
	}
	return p, nil
}

// ParseProfile decodes and validates a YAML profile. Unknown fields are
// rejected so a typo does not silently drop NVLink links.
func ParseProfile(data []byte) (*Profile, error) {
	var p Profile
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, errors.New("profile is empty")
	}
	if err := yaml.UnmarshalStrict(data, &p); err != nil {
		return nil, fmt.Errorf("decode profile: %w", err)
	}
	if err := p.validate(); err != nil {
		return nil, fmt.Errorf("profile %q: %w", p.Name, err)
	}
	return &p, nil
}

func (p *Profile) validate() error {
	var errs []error
	if !nameRE.MatchString(p.Name) || len(p.Name) > 63 {
		errs = append(errs, fmt.Errorf("name must be a DNS label (lower-case letters, digits, '-')"))
	}
	if p.GPUs < 1 || p.GPUs > maxGPUs {
		errs = append(errs, fmt.Errorf("gpus must be between 1 and %d, got %d", maxGPUs, p.GPUs))
	}
	if p.ProductName == "" || p.Architecture == "" {
		errs = append(errs, errors.New("productName and architecture are required"))
	}
	for field, v := range map[string]string{"cudaComputeCapability": p.CUDAComputeCapability, "driverVersion": p.DriverVersion, "cudaDriverVersion": p.CUDADriverVersion} {
		if !versionRE.MatchString(v) {
			errs = append(errs, fmt.Errorf("%s must look like 9.0 or 550.54.15, got %q", field, v))
		}
	}
	if q, err := resource.ParseQuantity(p.Memory); err != nil || q.Sign() <= 0 {
		errs = append(errs, fmt.Errorf("memory must be a positive quantity such as 80Gi, got %q", p.Memory))
	} else {
		p.memoryBytes = q.Value()
	}
	if p.NVLinksPerGPU < 0 {
		errs = append(errs, errors.New("nvlinksPerGPU must not be negative"))
	}
	if p.LinkBandwidthGBps < 0 {
		errs = append(errs, errors.New("linkBandwidthGBps must not be negative"))
	}
	for field, v := range map[string]int{"numaNodes": p.NUMANodes, "pcieRoots": p.PCIeRoots} {
		if v < 1 || (p.GPUs > 0 && v > p.GPUs) {
			errs = append(errs, fmt.Errorf("%s must be between 1 and gpus (%d), got %d", field, p.GPUs, v))
		}
	}
	if p.NVLink != nil {
		errs = append(errs, validateMatrix(p.NVLink, p.GPUs)...)
	}
	if p.Fabric != nil && p.Fabric.ClusterUUID == "" {
		errs = append(errs, errors.New("fabric.clusterUUID is required when fabric is set"))
	}
	return errors.Join(errs...)
}

func validateMatrix(m [][]int, n int) []error {
	if len(m) != n {
		return []error{fmt.Errorf("nvlink must have %d rows (one per GPU), got %d", n, len(m))}
	}
	var errs []error
	for i, row := range m {
		if len(row) != n {
			errs = append(errs, fmt.Errorf("nvlink row %d must have %d entries, got %d", i, n, len(row)))
			continue
		}
		if row[i] != 0 {
			errs = append(errs, fmt.Errorf("nvlink[%d][%d] must be 0: a GPU has no link to itself", i, i))
		}
	}
	if len(errs) > 0 {
		return errs
	}
	for i := range n {
		for j := range n {
			if m[i][j] < 0 {
				errs = append(errs, fmt.Errorf("nvlink[%d][%d] is negative", i, j))
			}
			if m[i][j] != m[j][i] {
				errs = append(errs, fmt.Errorf("nvlink is not symmetric: [%d][%d]=%d but [%d][%d]=%d", i, j, m[i][j], j, i, m[j][i]))
			}
		}
	}
	return errs
}
