// Command fakedriver lays out a fake NVIDIA driver installation whose
// libnvidia-ml.so.1 is the NVML stand-in of pkg/gpu/nvml/nvmltest, so that
// the plugin's nvml backend, from a binary or from the image, runs on a
// machine without a GPU: H100 GPUs behind an NVSwitch, versioned ELF
// libraries with their soname links, nvidia-smi, firmware and the device
// nodes (major 195, so it needs CAP_MKNOD). hack/verify-chart-cluster.sh
// runs the chart's nvml backend over it.
//
//	go run ./hack/fakedriver --root DIR [--gpus 8]
//
// Run it from the repository (it finds go-nvml's nvml.h with `go list`);
// it needs gcc.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/gputopo/gputopo/pkg/gpu/nvml/nvmltest"
)

func main() {
	root := flag.String("root", "", "existing empty directory to lay the driver installation out in")
	gpus := flag.Int("gpus", 8, "number of GPUs the stand-in reports")
	flag.Parse()
	if *root == "" || *gpus < 1 || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: fakedriver --root DIR [--gpus N]: --root is required and --gpus at least 1")
		os.Exit(2)
	}
	cfg := nvmltest.Config{CUDAVersion: 12040, GPUs: nvmltest.H100s(*gpus)}
	if err := nvmltest.FakeDriver(*root, cfg); err != nil {
		fmt.Fprintf(os.Stderr, "fakedriver: %v\n", err)
		os.Exit(1)
	}
	for _, g := range cfg.GPUs {
		fmt.Println(g.UUID)
	}
}
