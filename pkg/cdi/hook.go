package cdi

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi"
)

// HookName is the file name of the NVIDIA Container Toolkit's CDI hook, as
// it ships in the image next to the plugin and as the plugin installs it.
const HookName = "nvidia-cdi-hook"

// HookCommands are the nvidia-cdi-hook commands that nvcdi (the toolkit
// version in go.mod) may put into a spec; chmod is off by default there.
// A host's hook older than that library rejects the ones it does not know
// (enable-cuda-compat came with toolkit 1.17.5,
// disable-device-node-modification with 1.17.8), and the container fails
// to start.
var HookCommands = []string{
	string(nvcdi.CreateSymlinksHook),
	string(nvcdi.UpdateLDCacheHook),
	string(nvcdi.EnableCudaCompatHook),
	string(nvcdi.DisableDeviceNodeModificationHook),
}

// ErrHookUnusable reports a hook program that is missing, not executable,
// or does not run here.
var ErrHookUnusable = errors.New("nvidia-cdi-hook unusable")

// HookSupport is what a hook program can do.
type HookSupport struct {
	// Version is the first line the program prints for --version.
	Version string
	// Unsupported are the HookCommands it does not list: the specs must
	// not call them.
	Unsupported []string
}

// hookProbeTimeout bounds each run of the hook while probing it; a hook
// answers --help at once.
const hookProbeTimeout = 10 * time.Second

// ProbeHook runs the hook program at path (as this process sees it) to
// learn its version and which of HookCommands it supports, from the
// commands its --help lists. nvidia-ctk (whose hooks are "nvidia-ctk hook
// <command>") is probed the same way.
func ProbeHook(ctx context.Context, path string) (HookSupport, error) {
	st, err := os.Stat(path)
	switch {
	case err != nil:
		return HookSupport{}, fmt.Errorf("%w: %w", ErrHookUnusable, err)
	case !st.Mode().IsRegular():
		return HookSupport{}, fmt.Errorf("%w: %s is not a regular file", ErrHookUnusable, path)
	case st.Mode().Perm()&0o111 == 0:
		return HookSupport{}, fmt.Errorf("%w: %s is not executable", ErrHookUnusable, path)
	}
	var prefix []string
	if filepath.Base(path) == "nvidia-ctk" {
		prefix = []string{"hook"}
	}
	run := func(args ...string) ([]byte, error) {
		ctx, cancel := context.WithTimeout(ctx, hookProbeTimeout)
		defer cancel()
		var out bytes.Buffer
		cmd := exec.CommandContext(ctx, path, append(slices.Clone(prefix), args...)...)
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			return out.Bytes(), fmt.Errorf("%w: run %s %s: %w (output: %q)", ErrHookUnusable, path, strings.Join(args, " "), err, firstLine(out.Bytes()))
		}
		return out.Bytes(), nil
	}
	var s HookSupport
	if len(prefix) == 0 {
		// nvidia-ctk prints its own version, not the hook's; its
		// --help below tells what it can run.
		out, err := run("--version")
		if err != nil {
			return HookSupport{}, err
		}
		s.Version = firstLine(out)
	}
	out, err := run("--help")
	if err != nil {
		return HookSupport{}, err
	}
	known, ok := helpCommands(bytes.NewReader(out))
	if !ok {
		return HookSupport{}, fmt.Errorf("%w: %s --help lists no COMMANDS section, so which hooks it runs is unknown", ErrHookUnusable, path)
	}
	for _, c := range HookCommands {
		if !known[c] {
			s.Unsupported = append(s.Unsupported, c)
		}
	}
	return s, nil
}

// helpCommands reads the command names of a urfave/cli help text (every
// toolkit version uses it): the first word of each line under COMMANDS:,
// up to the next blank line.
func helpCommands(r io.Reader) (map[string]bool, bool) {
	sc := bufio.NewScanner(r)
	found, in := false, false
	names := map[string]bool{}
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.TrimSpace(line) == "COMMANDS:":
			found, in = true, true
		case !in:
		case strings.TrimSpace(line) == "" || !strings.HasPrefix(line, " "):
			in = false
		default:
			// "   help, h   Shows ..." names help and h.
			fields := strings.Fields(line)
			for _, f := range fields {
				names[strings.TrimSuffix(f, ",")] = true
				if !strings.HasSuffix(f, ",") {
					break
				}
			}
		}
	}
	return names, found
}

func firstLine(b []byte) string {
	line, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return line
}

// InstallHook copies the hook program at src into dir as HookName and
// returns its path. The copy replaces an older one by rename, so a
// container starting meanwhile runs either the old or the new program,
// never half a file; an identical copy is left alone.
func InstallHook(src, dir string) (string, error) {
	data, err := os.ReadFile(src)
	if err != nil {
		return "", fmt.Errorf("%w: read %s: %w", ErrHookUnusable, src, err)
	}
	dst := filepath.Join(dir, HookName)
	if old, err := os.ReadFile(dst); err == nil && bytes.Equal(old, data) {
		if err := os.Chmod(dst, 0o755); err != nil {
			return "", fmt.Errorf("make %s executable: %w", dst, err)
		}
		return dst, nil
	}
	tmp, err := os.CreateTemp(dir, "."+HookName+".tmp-*")
	if err != nil {
		return "", fmt.Errorf("install %s into %s: %w", HookName, dir, err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return "", fmt.Errorf("install %s: write %s: %w", HookName, tmp.Name(), err)
	}
	if err := tmp.Chmod(0o755); err != nil {
		_ = tmp.Close()
		return "", fmt.Errorf("install %s: %w", HookName, err)
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return "", fmt.Errorf("install %s: sync: %w", HookName, err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("install %s: %w", HookName, err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return "", fmt.Errorf("install %s: %w", HookName, err)
	}
	return dst, nil
}
