package main

import (
	"archive/tar"
	"debug/elf"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// An image built from two layer directories, read back from its OCI
// layout: the index names it as containerd wants, the config carries the
// entrypoint and user, and the flattened file system holds the files,
// symlinks and modes of both layers. Building again gives the same digest.
func TestBuildReadsBack(t *testing.T) {
	dir := t.TempDir()
	base, bin := filepath.Join(dir, "base"), filepath.Join(dir, "bin")
	write := func(p, data string, mode os.FileMode) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), mode); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(base, "lib/x86_64-linux-gnu/libc.so.6"), "libc", 0o755)
	if err := os.MkdirAll(filepath.Join(base, "lib64"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/lib/x86_64-linux-gnu/libc.so.6", filepath.Join(base, "lib64/libc.so.6")); err != nil {
		t.Fatal(err)
	}
	write(filepath.Join(base, "etc/passwd"), "root:x:0:0::/root:/sbin/nologin\n", 0o644)
	write(filepath.Join(bin, "usr/bin/gputopo"), "#!bin", 0o755)
	o := options{
		ref: "ghcr.io/gputopo/gputopo:0.1.0", out: filepath.Join(dir, "image.tar"),
		layers: []string{base, bin}, entrypoint: []string{"/usr/bin/gputopo"}, user: "65532:65532",
		env: []string{"PATH=/usr/bin"}, labels: map[string]string{"org.opencontainers.image.version": "0.1.0"},
		arch: "amd64", epoch: time.Unix(0, 0).UTC(),
	}
	digest, err := build(o)
	if err != nil {
		t.Fatal(err)
	}
	again, err := build(o)
	if err != nil {
		t.Fatal(err)
	}
	if again != digest {
		t.Errorf("second build: %+v, first %+v", again, digest)
	}

	unpacked := filepath.Join(dir, "layout")
	untar(t, o.out, unpacked)
	p, err := layout.FromPath(unpacked)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 {
		t.Fatalf("index has %d manifests, want 1", len(m.Manifests))
	}
	d := m.Manifests[0]
	if got := d.Annotations[annotationContainerdName]; got != o.ref {
		t.Errorf("%s = %q, want %q", annotationContainerdName, got, o.ref)
	}
	if got := d.Annotations[annotationRefName]; got != "0.1.0" {
		t.Errorf("%s = %q, want 0.1.0", annotationRefName, got)
	}
	if d.Digest != digest.manifest {
		t.Errorf("index names %s, build returned %s", d.Digest, digest.manifest)
	}
	img, err := p.Image(d.Digest)
	if err != nil {
		t.Fatal(err)
	}
	if cn, err := img.ConfigName(); err != nil || cn != digest.config {
		t.Errorf("config digest %s (%v), build returned %s", cn, err, digest.config)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != "65532:65532" || len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != "/usr/bin/gputopo" || cf.Architecture != "amd64" || cf.OS != "linux" {
		t.Errorf("config: user %q entrypoint %q platform %s/%s", cf.Config.User, cf.Config.Entrypoint, cf.OS, cf.Architecture)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 2 {
		t.Errorf("%d layers, want 2", len(layers))
	}
	got := map[string]*tar.Header{}
	tr := tar.NewReader(mutate.Extract(img))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got[h.Name] = h
	}
	for name, want := range map[string]struct {
		typ  byte
		mode int64
		link string
	}{
		"lib/x86_64-linux-gnu/libc.so.6": {tar.TypeReg, 0o755, ""},
		"lib64/libc.so.6":                {tar.TypeSymlink, 0o777, "/lib/x86_64-linux-gnu/libc.so.6"},
		"etc/passwd":                     {tar.TypeReg, 0o644, ""},
		"usr/bin/gputopo":                {tar.TypeReg, 0o755, ""},
	} {
		h := got[name]
		if h == nil {
			t.Errorf("%s: not in the image", name)
			continue
		}
		if h.Typeflag != want.typ || h.Mode != want.mode || h.Linkname != want.link || h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s: type %c mode %o link %q owner %d:%d, want type %c mode %o link %q owner 0:0",
				name, h.Typeflag, h.Mode, h.Linkname, h.Uid, h.Gid, want.typ, want.mode, want.link)
		}
	}
}

func TestBuildRejectsBadInput(t *testing.T) {
	dir := t.TempDir()
	for _, o := range []options{
		{ref: "ghcr.io/gputopo/gputopo:0.1.0", out: filepath.Join(dir, "x.tar")},
		{ref: "not a ref", out: filepath.Join(dir, "x.tar"), layers: []string{dir}},
		{ref: "ghcr.io/gputopo/gputopo:0.1.0", out: filepath.Join(dir, "x.tar"), layers: []string{filepath.Join(dir, "missing")}},
	} {
		if _, err := build(o); err == nil {
			t.Errorf("build(%+v) succeeded, want an error", o)
		}
	}
}

func untar(t *testing.T, file, dir string) {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, h.Name)
		if h.Typeflag == tar.TypeDir {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// A dynamically linked program on a layer without its C library is refused,
// naming the program and the library it lacks.
func TestBuildChecksLibraries(t *testing.T) {
	prog, err := os.Executable() // the test binary: linked against libc when cgo is on
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(prog)
	if err != nil {
		t.Fatal(err)
	}
	libs, _ := f.ImportedLibraries()
	f.Close()
	if len(libs) == 0 {
		t.Skip("the test binary is static (cgo off); nothing to check")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	data, err := os.ReadFile(prog)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(bin, "usr/bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "usr/bin/prog"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	o := options{ref: "example.com/x:1", out: filepath.Join(dir, "x.tar"), layers: []string{bin}, arch: "amd64", epoch: time.Unix(0, 0)}
	_, err = build(o)
	if err == nil || !strings.Contains(err.Error(), "/usr/bin/prog needs") || !strings.Contains(err.Error(), libs[0]) {
		t.Fatalf("build without a C library: err %v, want one naming /usr/bin/prog and %s", err, libs[0])
	}
}
