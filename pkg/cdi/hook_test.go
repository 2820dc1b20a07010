package cdi

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// olderHook stands in for nvidia-cdi-hook of toolkit 1.16: it knows
// create-symlinks and update-ldcache, lists them in --help the way
// urfave/cli does, and fails on any other command, as that version does.
const olderHook = `#!/bin/sh
case "$1" in
--version) echo "NVIDIA CDI Hook version 1.16.2"; echo "commit: 0000000" ;;
--help|-h|"") cat <<'HELP'
NAME:
   NVIDIA CDI Hook - Command to structure files for usage inside a container

USAGE:
   NVIDIA CDI Hook [global options] command [command options] [arguments...]

COMMANDS:
   update-ldcache   Update ldcache in a container by running ldconfig
   create-symlinks  A hook to create symlinks in the container.
   help, h          Shows a list of commands or help for one command

GLOBAL OPTIONS:
   --debug, -d  Enable debug-level logging (default: false)
HELP
;;
update-ldcache|create-symlinks) exit 0 ;;
*) echo "No help topic for '$1'" >&2; exit 3 ;;
esac
`

func writeScript(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestProbeHookOlderHook(t *testing.T) {
	hook := writeScript(t, "nvidia-cdi-hook", olderHook)
	got, err := ProbeHook(context.Background(), hook)
	if err != nil {
		t.Fatal(err)
	}
	want := HookSupport{Version: "NVIDIA CDI Hook version 1.16.2", Unsupported: []string{"enable-cuda-compat", "disable-device-node-modification"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ProbeHook (-want +got):\n%s", diff)
	}
}

func TestProbeHookNVIDIACTK(t *testing.T) {
	// nvidia-ctk runs hooks as "nvidia-ctk hook <command>".
	ctk := writeScript(t, "nvidia-ctk", "#!/bin/sh\n[ \"$1\" = hook ] || exit 9\nshift\n"+olderHook[len("#!/bin/sh\n"):])
	got, err := ProbeHook(context.Background(), ctk)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"enable-cuda-compat", "disable-device-node-modification"}, got.Unsupported); diff != "" {
		t.Errorf("unsupported (-want +got):\n%s", diff)
	}
}

func TestProbeHookRefusesWhatCannotRun(t *testing.T) {
	dir := t.TempDir()
	notExec := filepath.Join(dir, "not-executable")
	if err := os.WriteFile(notExec, []byte(olderHook), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, path := range map[string]string{
		"missing":        filepath.Join(dir, "nope"),
		"directory":      dir,
		"not executable": notExec,
		"fails":          writeScript(t, "nvidia-cdi-hook", "#!/bin/sh\nexit 1\n"),
		"no commands":    writeScript(t, "nvidia-cdi-hook", "#!/bin/sh\necho usage: hook\n"),
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := ProbeHook(context.Background(), path); !errors.Is(err, ErrHookUnusable) {
				t.Errorf("ProbeHook(%s) = %v, want ErrHookUnusable", path, err)
			}
		})
	}
}

// TestOlderHookRunsEverySpecHook generates the driver edits for an older
// host hook with the hooks it lacks disabled, and runs each hook of the
// spec with the stand-in: none may fail. Without disabling them, the spec
// calls hooks the older program rejects, which would fail every container.
func TestOlderHookRunsEverySpecHook(t *testing.T) {
	root := fakeDriverRoot(t)
	hook := writeScript(t, "nvidia-cdi-hook", olderHook)
	support, err := ProbeHook(context.Background(), hook)
	if err != nil {
		t.Fatal(err)
	}
	failing := func(roots DriverRoots) []string {
		t.Helper()
		common, err := newTestNVIDIA(t, roots).Common()
		if err != nil {
			t.Fatal(err)
		}
		var failed []string
		for _, h := range common.Hooks {
			if h.Path != hook {
				t.Errorf("hook %v runs %s, want %s", h.Args, h.Path, hook)
			}
			if err := exec.Command(h.Path, h.Args[1:]...).Run(); err != nil {
				failed = append(failed, h.Args[1])
			}
		}
		slices.Sort(failed)
		return failed
	}
	if got := failing(DriverRoots{Driver: root, HookPath: hook, DisabledHooks: support.Unsupported}); len(got) != 0 {
		t.Errorf("with the unsupported hooks disabled, hooks %v still fail", got)
	}
	want := []string{"disable-device-node-modification", "enable-cuda-compat"}
	if diff := cmp.Diff(want, failing(DriverRoots{Driver: root, HookPath: hook})); diff != "" {
		t.Errorf("hooks the older program rejects when nothing is disabled (-want +got):\n%s", diff)
	}
}

func TestNewNVIDIARefusesAnUnknownDisabledHook(t *testing.T) {
	root := fakeDriverRoot(t)
	if _, err := NewNVIDIA(context.Background(), fakeNVML(), DriverRoots{Driver: root, DisabledHooks: []string{"update-ldcahce"}}); err == nil {
		t.Error("a misspelt hook to disable was accepted")
	}
}

func TestInstallHook(t *testing.T) {
	src := writeScript(t, "nvidia-cdi-hook", olderHook)
	dir := t.TempDir()
	got, err := InstallHook(src, dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, HookName); got != want {
		t.Errorf("installed at %s, want %s", got, want)
	}
	check := func(want string) {
		t.Helper()
		data, err := os.ReadFile(got)
		if err != nil {
			t.Fatal(err)
		}
		if string(data) != want {
			t.Errorf("installed content %q, want %q", data, want)
		}
		st, err := os.Stat(got)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o755 {
			t.Errorf("installed mode %v, want 0755", st.Mode().Perm())
		}
	}
	check(olderHook)
	// A newer image replaces the installed copy; nothing else is left.
	newer := olderHook + "# newer\n"
	if err := os.WriteFile(src, []byte(newer), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := InstallHook(src, dir); err != nil {
		t.Fatal(err)
	}
	check(newer)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries after two installs, want only %s", len(entries), HookName)
	}
	if _, err := InstallHook(filepath.Join(t.TempDir(), "missing"), dir); !errors.Is(err, ErrHookUnusable) {
		t.Errorf("install of a missing hook: %v, want ErrHookUnusable", err)
	}
}
