package cluster

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// The images every containerd node has, built from the host's static
// busybox: no registry is reachable, so pods on such a node use these, with
// imagePullPolicy Never or IfNotPresent.
const (
	// ImageBusybox has /bin/sh and the busybox applets; it runs sh.
	ImageBusybox = "localhost/gputopo/busybox:v1"
	// ImagePause is the sandbox image: the same files, sleeping forever.
	ImagePause = "localhost/gputopo/pause:v1"
)

// image is one image of the local OCI layout.
type image struct {
	ref        string
	entrypoint []string
	cmd        []string
}

var localImages = []image{
	{ref: ImageBusybox, cmd: []string{"sh"}},
	{ref: ImagePause, entrypoint: []string{"/bin/sleep", "inf"}},
}

// checkStatic fails unless path is a statically linked executable, which is
// what an image with nothing else in it needs.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked (Debian's busybox, not busybox-static?)", path)
		}
	}
	return nil
}

// writeLocalImages writes an OCI image layout tarball holding ImageBusybox
// and ImagePause, for `ctr images import`. Both share one layer: busybox
// and a symlink per applet. The same busybox gives the same bytes.
func writeLocalImages(path string) error {
	if err := checkStatic(BusyboxBinary); err != nil {
		return fmt.Errorf("build the local images: %w; %s", err, runtimeDepsHint)
	}
	layer, err := busyboxLayer(BusyboxBinary)
	if err != nil {
		return fmt.Errorf("build the local images: %w", err)
	}
	blobs := map[string][]byte{}
	add := func(data []byte) string {
		sum := sha256.Sum256(data)
		d := "sha256:" + hex.EncodeToString(sum[:])
		blobs[d] = data
		return d
	}
	layerDigest := add(layer)
	type descriptor struct {
		MediaType   string            `json:"mediaType"`
		Digest      string            `json:"digest"`
		Size        int               `json:"size"`
		Annotations map[string]string `json:"annotations,omitempty"`
	}
	var manifests []descriptor
	for _, img := range localImages {
		cfg, err := json.Marshal(map[string]any{
			"architecture": "amd64",
			"os":           "linux",
			"config": map[string]any{
				"Env":        []string{"PATH=/bin"},
				"Entrypoint": img.entrypoint,
				"Cmd":        img.cmd,
			},
			"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
		})
		if err != nil {
			return err
		}
		manifest, err := json.Marshal(map[string]any{
			"schemaVersion": 2,
			"mediaType":     "application/vnd.oci.image.manifest.v1+json",
			"config":        descriptor{MediaType: "application/vnd.oci.image.config.v1+json", Digest: add(cfg), Size: len(cfg)},
			"layers":        []descriptor{{MediaType: "application/vnd.oci.image.layer.v1.tar", Digest: layerDigest, Size: len(layer)}},
		})
		if err != nil {
			return err
		}
		manifests = append(manifests, descriptor{
			MediaType: "application/vnd.oci.image.manifest.v1+json", Digest: add(manifest), Size: len(manifest),
			Annotations: map[string]string{
				"io.containerd.image.name":          img.ref,
				"org.opencontainers.image.ref.name": img.ref[strings.LastIndex(img.ref, ":")+1:],
			},
		})
	}
	index, err := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": manifests})
	if err != nil {
		return err
	}
	files := map[string][]byte{"oci-layout": []byte(`{"imageLayoutVersion":"1.0.0"}`), "index.json": index}
	for d, data := range blobs {
		files["blobs/sha256/"+strings.TrimPrefix(d, "sha256:")] = data
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "blobs/", Mode: 0o755, ModTime: time.Unix(0, 0)}); err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "blobs/sha256/", Mode: 0o755, ModTime: time.Unix(0, 0)}); err != nil {
		return err
	}
	if err := writeFiles(tw, files); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

// busyboxLayer is an uncompressed layer: /bin/busybox, a symlink in /bin
// per applet it lists, and the directories a container's mounts need.
func busyboxLayer(busybox string) ([]byte, error) {
	bin, err := os.ReadFile(busybox)
	if err != nil {
		return nil, err
	}
	out, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("list the applets of %s: %w", busybox, err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	for _, d := range []string{"bin", "dev", "etc", "proc", "sys", "tmp", "usr", "usr/local", "var"} {
		mode := int64(0o755)
		if d == "tmp" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: mode, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755, Size: int64(len(bin)), ModTime: epoch}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, err
	}
	applets := strings.Fields(string(out))
	sort.Strings(applets)
	for _, a := range applets {
		if a == "busybox" || strings.Contains(a, "/") {
			continue
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + a, Linkname: "busybox", Mode: 0o777, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func writeFiles(tw *tar.Writer, files map[string][]byte) error {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: 0o644, Size: int64(len(files[n])), ModTime: time.Unix(0, 0)}); err != nil {
			return err
		}
		if _, err := tw.Write(files[n]); err != nil {
			return err
		}
	}
	return nil
}
