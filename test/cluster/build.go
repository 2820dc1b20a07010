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
	// OutDir receives the binaries; DefaultBinDir() if empty.
	OutDir string
	// ModuleDir is this module's directory; found from the source location
	// or the working directory if empty.
	ModuleDir string
	// Force rebuilds binaries whose stamp says they are current.
	Force bool
	// Progress receives progress lines; os.Stderr if nil.
	Progress io.Writer
}

// Build builds Binaries into OutDir, skipping those whose stamp file says
// they were built from the same go.mod, go.sum, Go version and flags.
func Build(ctx context.Context, opts BuildOptions) error {
	if opts.OutDir == "" {
		opts.OutDir = DefaultBinDir()
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
	if err := os.MkdirAll(opts.OutDir, 0o755); err != nil {
		return fmt.Errorf("create binary dir: %w", err)
	}
	goVersion, err := exec.CommandContext(ctx, "go", "env", "GOVERSION").Output()
	if err != nil {
		return fmt.Errorf("ask go for its version: %w", err)
	}
	start := time.Now()
	for i, b := range Binaries {
		stamp, err := buildStamp(opts.ModuleDir, strings.TrimSpace(string(goVersion)), b)
		if err != nil {
			return err
		}
		out := filepath.Join(opts.OutDir, b.Name)
		stampFile := filepath.Join(opts.OutDir, "."+b.Name+".stamp")
		if !opts.Force && isCurrent(out, stampFile, stamp) {
			fmt.Fprintf(opts.Progress, "%s (%d/%d) is current\n", b.Name, i+1, len(Binaries))
			continue
		}
		fmt.Fprintf(opts.Progress, "building %s (%d/%d)... ", b.Name, i+1, len(Binaries))
		t := time.Now()
		cmd := exec.CommandContext(ctx, "go", "build", "-ldflags", LDFlags(), "-o", out+".tmp", b.Package)
		cmd.Dir = opts.ModuleDir
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
	fmt.Fprintf(opts.Progress, "binaries in %s (%s)\n", opts.OutDir, fmtDuration(time.Since(start)))
	return nil
}

func buildStamp(moduleDir, goVersion string, b Binary) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s\n%s\n", goVersion, os.Getenv("GOFLAGS"), b.Package, LDFlags())
	for _, f := range []string{"go.mod", "go.sum"} {
		data, err := os.ReadFile(filepath.Join(moduleDir, f))
		if err != nil {
			return "", fmt.Errorf("read %s for build stamp: %w", f, err)
		}
		h.Write(data)
	}
	return KubernetesVersion + " " + hex.EncodeToString(h.Sum(nil)), nil
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
