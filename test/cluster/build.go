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

// Release is a Kubernetes release the harness builds and runs: the
// version, and the module (a directory of test/cluster) whose go.mod
// requires k8s.io/kubernetes at that version and pins its staging modules.
type Release struct {
	Version string
	Module  string
}

// Releases are the supported Kubernetes releases, newest first: the newest
// patch of each supported minor release that the Go module proxy serves.
// The first is KubernetesVersion, built from test/cluster's own go.mod (the
// client libraries the harness uses); each older one has a module of its
// own, because one module can require only one version of
// k8s.io/kubernetes. Every release's binaries are built with the same flags
// every time, into a directory of their own (DefaultBinDirFor), so
// switching releases never rebuilds the other's.
var Releases = []Release{
	{Version: "v1.37.2", Module: "."},
	{Version: "v1.36.3", Module: "k8s-1.36"},
}

// KubernetesVersion is the newest supported release, which the harness
// builds and runs unless GPUTOPO_K8S_VERSION names another (Selected).
const KubernetesVersion = "v1.37.2"

// VersionEnv selects the Kubernetes release of `localcluster build`, of
// DefaultBinDir and so of every cluster the tests start.
const VersionEnv = "GPUTOPO_K8S_VERSION"

// LookupRelease finds the supported release named by v: a full version
// (v1.36.3) or a minor release (1.36, v1.36), with or without the v.
func LookupRelease(v string) (Release, error) {
	want := strings.TrimPrefix(strings.TrimSpace(v), "v")
	var names []string
	for _, r := range Releases {
		full := strings.TrimPrefix(r.Version, "v")
		if want == full || want == minorOf(full) {
			return r, nil
		}
		names = append(names, r.Version)
	}
	return Release{}, fmt.Errorf("kubernetes version %q is not one the harness builds: use one of %s (or its minor release, e.g. 1.36)",
		v, strings.Join(names, ", "))
}

// Selected is the release named by $GPUTOPO_K8S_VERSION, or the newest.
func Selected() (Release, error) {
	if v := os.Getenv(VersionEnv); v != "" {
		r, err := LookupRelease(v)
		if err != nil {
			return Release{}, fmt.Errorf("%s: %w", VersionEnv, err)
		}
		return r, nil
	}
	return Releases[0], nil
}

// minorOf is "1.36" for "1.36.3".
func minorOf(v string) string {
	parts := strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)
	if len(parts) < 2 {
		return v
	}
	return parts[0] + "." + parts[1]
}

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

// LDFlags are the link flags of every binary of Kubernetes version, which
// they stamp into it (what `kubectl version` and the API server's /version
// report). Only link flags differ from a plain `go build`, so the build
// cache is shared with everything else built on this machine, and a
// rebuild only relinks.
func LDFlags(version string) string {
	major, minor, _ := strings.Cut(minorOf(version), ".")
	f := []string{"-s", "-w"}
	for _, pkg := range []string{"k8s.io/component-base/version", "k8s.io/client-go/pkg/version"} {
		f = append(f,
			"-X", pkg+".gitVersion="+version,
			"-X", pkg+".gitMajor="+major,
			"-X", pkg+".gitMinor="+minor,
			"-X", pkg+".gitTreeState=clean",
			"-X", pkg+".buildDate="+buildDate)
	}
	return strings.Join(f, " ")
}

// BuildOptions configure Build.
type BuildOptions struct {
	// Version is the Kubernetes release to build (LookupRelease); the one
	// Selected() names if empty.
	Version string
	// OutDir receives the Kubernetes binaries; DefaultBinDirFor(Version)
	// if empty.
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
	rel, err := Selected()
	if opts.Version != "" {
		rel, err = LookupRelease(opts.Version)
	}
	if err != nil {
		return err
	}
	if opts.OutDir == "" {
		opts.OutDir = DefaultBinDirFor(rel.Version)
	}
	if opts.ContainerdOutDir == "" {
		opts.ContainerdOutDir = DefaultContainerdBinDir()
	}
	if err := opts.fillCommon(); err != nil {
		return err
	}
	goVersion, err := exec.CommandContext(ctx, "go", "env", "GOVERSION").Output()
	if err != nil {
		return fmt.Errorf("ask go for its version: %w", err)
	}
	sets := []toolset{
		{name: "Kubernetes " + rel.Version, version: rel.Version, subdir: rel.Module, outDir: opts.OutDir, ldflags: LDFlags(rel.Version), binaries: Binaries},
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
	var stale []Binary
	stamps := map[string]string{}
	for i, b := range set.binaries {
		stamp, err := buildStamp(moduleDir, goVersion, set, b)
		if err != nil {
			return err
		}
		stamps[b.Name] = stamp
		if !opts.Force && isCurrent(filepath.Join(set.outDir, b.Name), filepath.Join(set.outDir, "."+b.Name+".stamp"), stamp) {
			fmt.Fprintf(opts.Progress, "%s (%d/%d) is current\n", b.Name, i+1, len(set.binaries))
			continue
		}
		stale = append(stale, b)
	}
	if len(stale) > 0 {
		// One go build for all of them: the compiles they share run once,
		// and one binary links while the next one's packages compile.
		names := make([]string, len(stale))
		pkgs := make([]string, len(stale))
		for i, b := range stale {
			names[i], pkgs[i] = b.Name, b.Package
		}
		fmt.Fprintf(opts.Progress, "building %s (%d of %d)... ", strings.Join(names, ", "), len(stale), len(set.binaries))
		tmp, err := os.MkdirTemp(set.outDir, ".build-")
		if err != nil {
			return fmt.Errorf("create build dir: %w", err)
		}
		defer os.RemoveAll(tmp)
		args := []string{"build", "-ldflags", set.ldflags}
		if set.tags != "" {
			args = append(args, "-tags", set.tags)
		}
		cmd := exec.CommandContext(ctx, "go", append(append(args, "-o", tmp+string(filepath.Separator)), pkgs...)...)
		cmd.Dir = moduleDir
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stderr, &stderr
		t := time.Now()
		if err := cmd.Run(); err != nil {
			fmt.Fprintln(opts.Progress, "failed")
			return fmt.Errorf("build %s: %w\n%s", strings.Join(names, ", "), err, stderr.String())
		}
		for _, b := range stale {
			out := filepath.Join(set.outDir, b.Name)
			if err := os.Rename(filepath.Join(tmp, goOutputName(b.Package)), out); err != nil {
				return fmt.Errorf("install %s: %w", b.Name, err)
			}
			if err := os.WriteFile(filepath.Join(set.outDir, "."+b.Name+".stamp"), []byte(stamps[b.Name]+"\n"), 0o644); err != nil {
				return fmt.Errorf("write stamp of %s: %w", b.Name, err)
			}
		}
		fmt.Fprintf(opts.Progress, "done in %s\n", fmtDuration(time.Since(t)))
	}
	fmt.Fprintf(opts.Progress, "%s binaries in %s (%s)\n", set.name, set.outDir, fmtDuration(time.Since(start)))
	return nil
}

// goOutputName is the file go build -o DIR/ writes a main package to: the
// last element of its import path that is not a major version (v3).
func goOutputName(pkg string) string {
	elems := strings.Split(pkg, "/")
	last := elems[len(elems)-1]
	if len(elems) > 1 && len(last) > 1 && last[0] == 'v' && strings.Trim(last[1:], "0123456789") == "" {
		return elems[len(elems)-2]
	}
	return last
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

// fillCommon sets the defaults every build shares: progress to stderr,
// and the harness module's directory.
func (o *BuildOptions) fillCommon() error {
	if o.Progress == nil {
		o.Progress = os.Stderr
	}
	if o.ModuleDir == "" {
		dir, err := findModuleDir()
		if err != nil {
			return err
		}
		o.ModuleDir = dir
	}
	return nil
}
