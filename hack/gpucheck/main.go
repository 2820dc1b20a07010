// Command gpucheck compares what gputopo-kubelet-plugin publishes on a real
// GPU node with what nvidia-smi and sysfs say, and checks a CDI spec the
// plugin wrote; hack/gpu-check.sh collects the inputs and runs it.
//
//	gpucheck facts -slices F -smi-query F -smi F [-topo F] [-nvlink-status F] [-sysfs DIR]
//	gpucheck cdi SPEC
//	gpucheck oci -config FILE -cdi-dir DIR -device ID [-rootfs DIR] -- COMMAND...
//
// It prints one line per comparison and exits 1 on any mismatch.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "gpucheck: %v\n", err)
		os.Exit(1)
	}
}

// errMismatch is returned when a comparison failed (the report says which).
var errMismatch = errors.New("mismatches found")

func run(args []string, out io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: gpucheck facts ... | gpucheck cdi SPEC | gpucheck oci ...")
	}
	var r *report
	var err error
	switch args[0] {
	case "facts":
		r, err = runFacts(args[1:])
	case "cdi":
		r, err = runCDI(args[1:])
	case "oci":
		r, err = runOCI(args[1:])
	default:
		return fmt.Errorf("unknown command %q: want facts, cdi or oci", args[0])
	}
	if err != nil {
		return err
	}
	for _, l := range r.lines {
		fmt.Fprintln(out, l)
	}
	if r.mismatches > 0 {
		return fmt.Errorf("%w: %d", errMismatch, r.mismatches)
	}
	return nil
}

func runFacts(args []string) (*report, error) {
	fs := flag.NewFlagSet("facts", flag.ContinueOnError)
	slicesFile := fs.String("slices", "", "output of gputopo-kubelet-plugin --print-resource-slices")
	queryFile := fs.String("smi-query", "", "output of nvidia-smi --query-gpu=index,uuid,pci.bus_id,memory.total,driver_version,name --format=csv,noheader,nounits")
	smiFile := fs.String("smi", "", "output of nvidia-smi")
	topoFile := fs.String("topo", "", "output of nvidia-smi topo -m (optional)")
	statusFile := fs.String("nvlink-status", "", "output of nvidia-smi nvlink --status (optional)")
	sysfs := fs.String("sysfs", "/sys", "root of sysfs")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	read := func(name, file string, required bool) ([]byte, error) {
		if file == "" {
			if required {
				return nil, fmt.Errorf("-%s is required", name)
			}
			return nil, nil
		}
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("-%s: %w", name, err)
		}
		return data, nil
	}
	var f facts
	f.sysfs = *sysfs
	data, err := read("slices", *slicesFile, true)
	if err != nil {
		return nil, err
	}
	pub, err := parseSlices(data)
	if err != nil {
		return nil, err
	}
	if data, err = read("smi-query", *queryFile, true); err != nil {
		return nil, err
	}
	if f.smi, err = parseSMIQuery(data); err != nil {
		return nil, err
	}
	if data, err = read("smi", *smiFile, true); err != nil {
		return nil, err
	}
	if f.cuda, err = parseCUDAVersion(data); err != nil {
		return nil, err
	}
	if data, err = read("topo", *topoFile, false); err != nil {
		return nil, err
	}
	if data != nil {
		if f.topo, err = parseTopo(data); err != nil {
			return nil, err
		}
	}
	if data, err = read("nvlink-status", *statusFile, false); err != nil {
		return nil, err
	}
	if data != nil {
		f.links = parseNVLinkStatus(data)
	}
	return compare(pub, f), nil
}

// runCDI validates a spec with the CDI library (as a runtime loading it
// would) and checks that every host path in it exists.
func runCDI(args []string) (*report, error) {
	if len(args) != 1 {
		return nil, errors.New("usage: gpucheck cdi SPEC")
	}
	spec, err := cdiapi.ReadSpec(args[0], 0)
	if err != nil {
		return nil, fmt.Errorf("the CDI library rejects %s: %w", args[0], err)
	}
	r := &report{}
	r.ok("CDI spec %s is valid (kind %s, version %s, %d device(s))", args[0], spec.Kind, spec.Version, len(spec.Devices))
	var paths []string
	edits := []*cdiEdits{{spec.ContainerEdits.DeviceNodes, spec.ContainerEdits.Mounts, spec.ContainerEdits.Hooks}}
	for _, d := range spec.Devices {
		edits = append(edits, &cdiEdits{d.ContainerEdits.DeviceNodes, d.ContainerEdits.Mounts, d.ContainerEdits.Hooks})
	}
	for _, e := range edits {
		paths = append(paths, e.hostPaths()...)
	}
	if len(spec.Devices) > 0 && len(paths) == 0 {
		r.skip("CDI spec names no host paths (simulated GPUs)")
	}
	checkCDISpec(r, paths)
	return r, nil
}
