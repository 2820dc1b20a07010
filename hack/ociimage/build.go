package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The index annotations that name an image in an OCI layout: containerd's
// import reads the first (a full reference), other tools the second (the
// tag).
const (
	annotationContainerdName = "io.containerd.image.name"
	annotationRefName        = "org.opencontainers.image.ref.name"
)

type options struct {
	ref        string
	out        string
	layers     []string
	entrypoint []string
	user       string
	env        []string
	labels     map[string]string
	arch       string
	epoch      time.Time
}

// built names what build wrote: the digests of the image's manifest and of
// its config (the image ID that containerd's CRI reports for a container).
type built struct{ manifest, config v1.Hash }

// build writes the image.
func build(o options) (built, error) {
	if o.ref == "" || o.out == "" || len(o.layers) == 0 {
		return built{}, errors.New("--ref, --out and at least one --layer are required")
	}
	tag, err := name.NewTag(o.ref, name.StrictValidation)
	if err != nil {
		return built{}, fmt.Errorf("--ref %q: want REPOSITORY:TAG, e.g. ghcr.io/gputopo/gputopo:0.1.0: %w", o.ref, err)
	}
	if err := checkELF(o.layers, o.arch); err != nil {
		return built{}, fmt.Errorf("the image would not run: %w", err)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for _, dir := range o.layers {
		data, err := layerTar(dir, o.epoch)
		if err != nil {
			return built{}, fmt.Errorf("layer %s: %w", dir, err)
		}
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(data)), nil
		}, tarball.WithMediaType(types.OCILayer))
		if err != nil {
			return built{}, fmt.Errorf("layer %s: %w", dir, err)
		}
		if img, err = mutate.AppendLayers(img, l); err != nil {
			return built{}, fmt.Errorf("layer %s: %w", dir, err)
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return built{}, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = o.arch, "linux"
	cf.Created = v1.Time{Time: o.epoch}
	cf.Config.Entrypoint = o.entrypoint
	cf.Config.User = o.user
	cf.Config.Env = o.env
	cf.Config.Labels = o.labels
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return built{}, err
	}
	if img, err = mutate.CreatedAt(img, v1.Time{Time: o.epoch}); err != nil {
		return built{}, err
	}
	digest, err := img.Digest()
	if err != nil {
		return built{}, err
	}
	config, err := img.ConfigName()
	if err != nil {
		return built{}, err
	}

	tmp, err := os.MkdirTemp(filepath.Dir(o.out), ".ociimage-")
	if err != nil {
		return built{}, err
	}
	defer os.RemoveAll(tmp)
	p, err := layout.Write(tmp, empty.Index)
	if err != nil {
		return built{}, fmt.Errorf("write OCI layout: %w", err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		annotationContainerdName: tag.Name(),
		annotationRefName:        tag.TagStr(),
	})); err != nil {
		return built{}, fmt.Errorf("write OCI layout: %w", err)
	}
	if err := tarDir(tmp, o.out, o.epoch); err != nil {
		return built{}, fmt.Errorf("write %s: %w", o.out, err)
	}
	return built{manifest: digest, config: config}, nil
}

// layerTar is the uncompressed tar of dir's tree: directories, regular
// files and symlinks, sorted by path, owned by 0:0 (the files' modes kept),
// with modification time epoch. Anything else in dir is an error.
func layerTar(dir string, epoch time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := writeTree(tw, dir, epoch); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// tarDir writes dir's tree (the OCI layout) to the tarball out.
func tarDir(dir, out string, epoch time.Time) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	if err := writeTree(tw, dir, epoch); err != nil {
		f.Close()
		return err
	}
	if err := tw.Close(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func writeTree(tw *tar.Writer, dir string, epoch time.Time) error {
	var paths []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			paths = append(paths, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(paths)
	for _, p := range paths {
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		hdr := &tar.Header{Name: rel, Mode: int64(fi.Mode().Perm()), ModTime: epoch}
		if fi.Mode()&fs.ModeSticky != 0 {
			hdr.Mode |= 0o1000
		}
		if fi.Mode()&fs.ModeSetuid != 0 {
			hdr.Mode |= 0o4000
		}
		var data []byte
		switch {
		case fi.IsDir():
			hdr.Typeflag, hdr.Name = tar.TypeDir, rel+"/"
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		case fi.Mode().IsRegular():
			if data, err = os.ReadFile(p); err != nil {
				return err
			}
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(data))
		default:
			return fmt.Errorf("%s: %s is neither a file, a directory nor a symlink", p, fi.Mode().Type())
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := tw.Write(data); err != nil {
			return err
		}
	}
	return nil
}
