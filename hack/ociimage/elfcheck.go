package main

import (
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// libDirs are where the dynamic loader of a Debian system looks for
// libraries, by image architecture.
var libDirs = map[string][]string{
	"amd64": {"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/lib", "/usr/lib"},
	"arm64": {"/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/lib", "/usr/lib"},
}

// checkELF fails unless every dynamically linked executable in the layers
// finds its program interpreter and the libraries it needs (DT_NEEDED) in
// the image: a binary linked against glibc on an image without it would
// fail only when a container starts ("no such file or directory").
func checkELF(layers []string, arch string) error {
	dirs, ok := libDirs[arch]
	if !ok {
		return fmt.Errorf("--arch %q: want one of amd64, arm64", arch)
	}
	var errs []error
	for _, root := range layers {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return err
			}
			fi, err := d.Info()
			if err != nil || fi.Mode().Perm()&0o111 == 0 {
				return err
			}
			f, err := elf.Open(p)
			if err != nil {
				return nil // not ELF: a script or data
			}
			defer f.Close()
			rel, _ := filepath.Rel(root, p)
			interp := ""
			for _, prog := range f.Progs {
				if prog.Type == elf.PT_INTERP {
					data := make([]byte, prog.Filesz)
					if _, err := prog.ReadAt(data, 0); err != nil {
						return fmt.Errorf("/%s: read its interpreter: %w", rel, err)
					}
					interp = strings.TrimRight(string(data), "\x00")
				}
			}
			if interp == "" {
				return nil // static
			}
			if !exists(layers, interp) {
				errs = append(errs, fmt.Errorf("/%s needs its program interpreter %s, which no layer has", rel, interp))
			}
			libs, err := f.ImportedLibraries()
			if err != nil {
				return fmt.Errorf("/%s: read its libraries: %w", rel, err)
			}
			for _, lib := range libs {
				found := false
				for _, d := range dirs {
					if exists(layers, path.Join(d, lib)) {
						found = true
						break
					}
				}
				if !found {
					errs = append(errs, fmt.Errorf("/%s needs %s, which no layer has in %s", rel, lib, strings.Join(dirs, ", ")))
				}
			}
			return nil
		})
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// exists reports whether the absolute path p of the image, symlinks
// followed inside the image, is a file in one of the layers (the upper
// layer's entry winning).
func exists(layers []string, p string) bool {
	for range 16 {
		var fi os.FileInfo
		var host string
		for i := len(layers) - 1; i >= 0; i-- {
			host = filepath.Join(layers[i], filepath.FromSlash(p))
			if st, err := os.Lstat(host); err == nil {
				fi = st
				break
			}
		}
		if fi == nil {
			return false
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			return fi.Mode().IsRegular()
		}
		target, err := os.Readlink(host)
		if err != nil {
			return false
		}
		if !path.IsAbs(target) {
			target = path.Join(path.Dir(p), target)
		}
		p = path.Clean(target)
	}
	return false
}
