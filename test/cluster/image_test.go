package cluster

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestLocalImages checks the OCI layout that containerd nodes import: an
// index naming both images, each manifest's blobs present, and a layer in
// which sh and sleep lead to busybox. The same busybox gives the same bytes.
func TestLocalImages(t *testing.T) {
	if err := checkStatic(BusyboxBinary); err != nil {
		t.Skipf("no static busybox (%v); %s", err, runtimeDepsHint)
	}
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.tar"), filepath.Join(dir, "b.tar")
	for _, p := range []string{a, b} {
		if err := writeLocalImages(p); err != nil {
			t.Fatal(err)
		}
	}
	da, _ := os.ReadFile(a)
	db, _ := os.ReadFile(b)
	if !bytes.Equal(da, db) {
		t.Error("two builds of the local images differ")
	}
	files := untar(t, da)
	var index struct {
		Manifests []struct {
			Digest      string            `json:"digest"`
			Annotations map[string]string `json:"annotations"`
		} `json:"manifests"`
	}
	if err := json.Unmarshal(files["index.json"], &index); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range index.Manifests {
		names = append(names, m.Annotations["io.containerd.image.name"])
		var manifest struct {
			Config struct{ Digest string }   `json:"config"`
			Layers []struct{ Digest string } `json:"layers"`
		}
		if err := json.Unmarshal(blob(t, files, m.Digest), &manifest); err != nil {
			t.Fatal(err)
		}
		var cfg struct {
			Config struct{ Entrypoint, Cmd []string } `json:"config"`
		}
		if err := json.Unmarshal(blob(t, files, manifest.Config.Digest), &cfg); err != nil {
			t.Fatal(err)
		}
		if len(cfg.Config.Entrypoint)+len(cfg.Config.Cmd) == 0 {
			t.Errorf("image %s runs nothing", m.Annotations["io.containerd.image.name"])
		}
		if len(manifest.Layers) != 1 {
			t.Fatalf("image %s has %d layers, want 1", m.Annotations["io.containerd.image.name"], len(manifest.Layers))
		}
		layer := untar(t, blob(t, files, manifest.Layers[0].Digest))
		for _, f := range []string{"bin/busybox", "bin/sh", "bin/sleep", "bin/stat"} {
			if _, ok := layer[f]; !ok {
				t.Errorf("image %s lacks %s", m.Annotations["io.containerd.image.name"], f)
			}
		}
	}
	if diff := cmp.Diff([]string{ImageBusybox, ImagePause}, names); diff != "" {
		t.Errorf("images (-want +got):\n%s", diff)
	}
}

// untar returns the regular files and symlinks (as their targets) of a tar.
func untar(t *testing.T, data []byte) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		switch h.Typeflag {
		case tar.TypeReg:
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			out[h.Name] = b
		case tar.TypeSymlink:
			out[h.Name] = []byte(h.Linkname)
		}
	}
}

func blob(t *testing.T, files map[string][]byte, digest string) []byte {
	t.Helper()
	b, ok := files["blobs/sha256/"+strings.TrimPrefix(digest, "sha256:")]
	if !ok {
		t.Fatalf("blob %s missing from the layout", digest)
	}
	return b
}
