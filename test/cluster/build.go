package cluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// KubernetesVersion is the version the harness builds and runs.
const KubernetesVersion = "v1.37.1"

// buildDate is fixed so that a rebuild gives identical link flags.
const buildDate = "2026-01-01T00:00:00Z"

// Binary is a program the harness builds from this module's dependencies.
type Binary struct {
	Name    string
	Package string
}

// Binaries lists what `localcluster build` produces, in build order.
var Binaries = []Binary{
	{"etcd", "go.etcd.io/etcd/server/v3"},
	{"kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver"},
	{"kube-controller-manager", "k8s.io/kubernetes/cmd/kube-controller-manager"},
	{"kube-scheduler", "k8s.io/kubernetes/cmd/kube-scheduler"},
	{"kubelet", "k8s.io/kubernetes/cmd/kubelet"},
	{"kubectl", "k8s.io/kubernetes/cmd/kubectl"},
}

// ContainerdVersion is the containerd release real-runtime nodes run,
// pinned in the module test/cluster/containerd.
const ContainerdVersion = "v2.4.2"

// ContainerdBinaries lists what `localcluster build` produces for nodes
// with runtime containerd: the daemon with its CRI plugin, the runc shim,
// and ctr, which imports the local images.
var ContainerdBinaries = []Binary{
	{"containerd", "github.com/containerd/containerd/v2/cmd/containerd"},
	{"containerd-shim-runc-v2", "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"},
	{"ctr", "github.com/containerd/containerd/v2/cmd/ctr"},
}

// containerdTags leave out the btrfs snapshotter, whose cgo needs the
// btrfs headers; nodes use overlayfs.
const containerdTags = "no_btrfs"

// ContainerdLDFlags are the link flags of every containerd binary, as
// LDFlags are of the Kubernetes ones.
func ContainerdLDFlags() string {
	return "-s -w -X github.com/containerd/containerd/v2/version.Version=" + ContainerdVersion
}

// toolset is binaries built from one module with one set of flags, into
// one directory.
type toolset struct {
	name     string
	version  string
	subdir   string // of test/cluster: the module they are built from
	outDir   string
	tags     string
	ldflags  string
	binaries []Binary
}

// LDFlags are the link flags of every binary. Only link flags differ from a
// plain `go build`, so the build cache is shared with everything else built
// on this machine, and a rebuild only relinks.
func LDFlags() string {
	f := []string{"-s", "-w"}
	for _, pkg := range []string{"k8s.io/component-base/version", "k8s.io/client-go/pkg/version"} {
		f = append(f,
			"-X", pkg+".gitVersion="+KubernetesVersion,
			"-X", pkg+".gitMajor=1",
			"-X", pkg+".gitMinor=37",
			"-X", pkg+".gitTreeState=clean",
			"-X", pkg+".buildDate="+buildDate)
	}
	return strings.Join(f, " ")
}

// BuildOptions configure Build.
type BuildOptions struct {
	// OutDir receives the Kubernetes binaries; DefaultBinDir() if empty.
	OutDir string
	// ContainerdOutDir receives the containerd binaries;
	// DefaultContainerdBinDir() if empty.
	ContainerdOutDir string
	// PeersOutDir receives the peers' managers and manifests (BuildPeers);
	// DefaultPeersBinDir() if empty.
	PeersOutDir string
	// ModuleDir is this module's directory; found from the source location
	// or the working directory if empty.
	ModuleDir string
	// Force rebuilds binaries whose stamp says they are current.
	Force bool
	// Progress receives progress lines; os.Stderr if nil.
	Progress io.Writer
}

// Build builds Binaries into OutDir and ContainerdBinaries into
// ContainerdOutDir, skipping those whose stamp file says they were built
// from the same go.mod, go.sum, Go version and flags.
func Build(ctx context.Context, opts BuildOptions) error {
	if opts.OutDir == "" {
		opts.OutDir = DefaultBinDir()
	}
	if opts.ContainerdOutDir == "" {
		opts.ContainerdOutDir = DefaultContainerdBinDir()
	}
	if opts.Progress == nil {
		opts.Progress = os.Stderr
	}
	if opts.ModuleDir == "" {
		dir, err := findModuleDir()
		if err != nil {
			return err
		}
		opts.ModuleDir = dir
	}
	goVersion, err := exec.CommandContext(ctx, "go", "env", "GOVERSION").Output()
	if err != nil {
		return fmt.Errorf("ask go for its version: %w", err)
	}
	sets := []toolset{
		{name: "Kubernetes", version: KubernetesVersion, subdir: ".", outDir: opts.OutDir, ldflags: LDFlags(), binaries: Binaries},
		{name: "containerd", version: ContainerdVersion, subdir: "containerd", outDir: opts.ContainerdOutDir,
			tags: containerdTags, ldflags: ContainerdLDFlags(), binaries: ContainerdBinaries},
	}
	for _, set := range sets {
		if err := buildSet(ctx, opts, strings.TrimSpace(string(goVersion)), set); err != nil {
			return err
		}
	}
	return nil
}

func buildSet(ctx context.Context, opts BuildOptions, goVersion string, set toolset) error {
	moduleDir := filepath.Join(opts.ModuleDir, set.subdir)
	if err := os.MkdirAll(set.outDir, 0o755); err != nil {
		return fmt.Errorf("create binary dir: %w", err)
	}
	start := time.Now()
	for i, b := range set.binaries {
		stamp, err := buildStamp(moduleDir, goVersion, set, b)
		if err != nil {
			return err
		}
		out := filepath.Join(set.outDir, b.Name)
		stampFile := filepath.Join(set.outDir, "."+b.Name+".stamp")
		if !opts.Force && isCurrent(out, stampFile, stamp) {
			fmt.Fprintf(opts.Progress, "%s (%d/%d) is current\n", b.Name, i+1, len(set.binaries))
			continue
		}
		fmt.Fprintf(opts.Progress, "building %s (%d/%d)... ", b.Name, i+1, len(set.binaries))
		t := time.Now()
		args := []string{"build", "-ldflags", set.ldflags}
		if set.tags != "" {
			args = append(args, "-tags", set.tags)
		}
		cmd := exec.CommandContext(ctx, "go", append(args, "-o", out+".tmp", b.Package)...)
		cmd.Dir = moduleDir
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stderr, &stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintln(opts.Progress, "failed")
			os.Remove(out + ".tmp")
			return fmt.Errorf("build %s: %w\n%s", b.Name, err, stderr.String())
		}
		if err := os.Rename(out+".tmp", out); err != nil {
			return fmt.Errorf("install %s: %w", b.Name, err)
		}
		if err := os.WriteFile(stampFile, []byte(stamp+"\n"), 0o644); err != nil {
			return fmt.Errorf("write stamp of %s: %w", b.Name, err)
		}
		fmt.Fprintf(opts.Progress, "done in %s\n", fmtDuration(time.Since(t)))
	}
	fmt.Fprintf(opts.Progress, "%s binaries in %s (%s)\n", set.name, set.outDir, fmtDuration(time.Since(start)))
	return nil
}

func buildStamp(moduleDir, goVersion string, set toolset, b Binary) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s\n%s\n", goVersion, os.Getenv("GOFLAGS"), b.Package, set.ldflags)
	if set.tags != "" {
		fmt.Fprintf(h, "tags %s\n", set.tags)
	}
	for _, f := range []string{"go.mod", "go.sum"} {
		data, err := os.ReadFile(filepath.Join(moduleDir, f))
		if err != nil {
			return "", fmt.Errorf("read %s for build stamp: %w", f, err)
		}
		h.Write(data)
	}
	return set.version + " " + hex.EncodeToString(h.Sum(nil)), nil
}

func isCurrent(bin, stampFile, stamp string) bool {
	if _, err := os.Stat(bin); err != nil {
		return false
	}
	got, err := os.ReadFile(stampFile)
	return err == nil && strings.TrimSpace(string(got)) == stamp
}

const modulePath = "github.com/gputopo/gputopo/test/cluster"

// findModuleDir finds this module's directory: where this file was compiled
// from, else the working directory or one of its parents, or their
// test/cluster subdirectory.
func findModuleDir() (string, error) {
	var candidates []string
	if _, file, _, ok := runtime.Caller(0); ok {
		candidates = append(candidates, filepath.Dir(file))
	}
	if wd, err := os.Getwd(); err == nil {
		for d := wd; ; d = filepath.Dir(d) {
			candidates = append(candidates, d, filepath.Join(d, "test", "cluster"))
			if d == filepath.Dir(d) {
				break
			}
		}
	}
	for _, d := range candidates {
		data, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil && bytes.HasPrefix(data, []byte("module "+modulePath+"\n")) {
			return d, nil
		}
	}
	return "", fmt.Errorf("find the directory of module %s: run from the repository", modulePath)
}

func fmtDuration(d time.Duration) string {
	d = d.Round(time.Second)
	if d < time.Minute {
		return fmt.Sprintf("%ds", int(d.Seconds()))
	}
	return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
}
