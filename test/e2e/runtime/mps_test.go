package runtime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gputopo/gputopo/pkg/gpu"
	"github.com/gputopo/gputopo/pkg/gpu/sim"
	"github.com/gputopo/gputopo/pkg/mps"
	"github.com/gputopo/gputopo/pkg/mps/mpstest"
	"github.com/gputopo/gputopo/pkg/topology"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

// mpsReport is what a container of TestSharedGPUGetsAnMPSDaemon prints:
// its environment, its mount of the MPS pipe directory, the pid file the
// daemon wrote there, and the pid the stand-in daemon wrote into the
// /dev/shm it sees.
const mpsReport = `env; echo @@mounts; grep ' ` + topology.MPSContainerPipeDir + ` ' /proc/mounts; ` +
	`echo @@pid; cat ` + topology.MPSContainerPipeDir + `/` + mps.PidFile + ` 2>/dev/null; echo; ` +
	`echo @@shm; cat ` + topology.MPSContainerShmDir + `/` + mpstest.ShmMarker + ` 2>/dev/null; echo; ` +
	`echo @@shmmount; grep ' ` + topology.MPSContainerShmDir + ` ' /proc/mounts; echo @@end; exec sleep inf`

// TestSharedGPUGetsAnMPSDaemon: with --mps-control-path naming a stand-in
// that records what it is asked, the first share of the shared GPU starts
// one control daemon, for that GPU's UUID, with the pipe and log
// directories under the plugin's mps/<uuid>, and sets the share's compute
// and memory limits as its defaults; a second share reuses it; both share
// containers that containerd runs see the pipe directory mounted at
// /tmp/nvidia-mps (with the pid file the daemon wrote), the /dev/shm the
// daemon sees (the plugin's tmpfs of --mps-shm-size, 1Gi), and
// CUDA_MPS_PIPE_DIRECTORY, a whole GPU's container sees none of them; a plugin
// restart neither doubles nor loses the daemon; deleting one share's pod
// keeps it, deleting the last stops it (quit) and removes its directory.
// The simulated GPU is in compute mode EXCLUSIVE_PROCESS while its daemon
// runs and DEFAULT again after.
func TestSharedGPUGetsAnMPSDaemon(t *testing.T) {
	dir := t.TempDir()
	// The plugin (root) and its daemons run the stand-in from here.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	record := filepath.Join(dir, "record")
	control, err := mpstest.Write(dir, record)
	if err != nil {
		t.Fatal(err)
	}
	_, pluginDir := lc.PluginDirs(node)
	root := filepath.Join(pluginDir, "mps")
	flag := "--mps-control-path=" + control
	t.Cleanup(func() {
		if err := lc.StopPlugin(node); err != nil {
			t.Error(err)
		}
		// Whatever failed, no stand-in daemon outlives the test.
		if m, err := mps.New(mps.Config{ControlPath: control, Root: root}); err == nil {
			if err := m.Sync(context.Background(), nil); err != nil {
				t.Error(err)
			}
		}
		if err := lc.StartPlugin(node); err != nil { // with the cluster's arguments again
			t.Errorf("restart plugin of %s: %v", node, err)
		}
	})
	// Claims of earlier tests, on their way out, may hold the shared GPU
	// (a whole-GPU claim on it counts as a share of all of it): start
	// from none.
	framework.Eventually(t, 2*time.Minute, "earlier claims on "+node+" unprepared", noClaimPrepared)
	if err := lc.StopPlugin(node); err != nil {
		t.Fatal(err)
	}
	if err := lc.StartPluginWith(node, flag); err != nil {
		t.Fatal(err)
	}
	if got := readRecord(t, record); len(got) != 0 {
		t.Fatalf("with no claim prepared the stand-in recorded %v", got)
	}

	a, logsA := runPod(t, "mps-a", map[string]string{"share": "gpu-share-quarter"}, mpsReport)
	b, logsB := runPod(t, "mps-b", map[string]string{"share": "gpu-share-quarter"}, mpsReport)
	whole, logsWhole := runPod(t, "mps-whole", map[string]string{"gpu": "gpu-1"}, mpsReport)

	ctx := framework.Ctx(t)
	claimA, err := framework.PodClaim(ctx, client, a, "share")
	if err != nil {
		t.Fatal(err)
	}
	claimB, err := framework.PodClaim(ctx, client, b, "share")
	if err != nil {
		t.Fatal(err)
	}
	devices := sliceDevices(t)
	shared := claimA.Status.Allocation.Devices.Results[0].Device
	if other := claimB.Status.Allocation.Devices.Results[0].Device; other != shared {
		t.Fatalf("the two quarters are of %s and %s; the suite's node shares one GPU", shared, other)
	}
	uuid := str(devices[shared], topology.AttrUUID)
	// The daemon's directories as the plugin lays them out.
	layout, err := mps.New(mps.Config{ControlPath: control, Root: root})
	if err != nil {
		t.Fatal(err)
	}
	pipe, logDir := layout.PipeDir(uuid), layout.LogDir(uuid)
	modeFile := sim.ComputeModeFile(sim.ComputeModeDir(lc.SimDevRoot(node)), uuid)
	if got := readMode(t, modeFile); got != gpu.ComputeModeExclusiveProcess {
		t.Errorf("compute mode of %s with its MPS daemon running: %q, want %s", shared, got, gpu.ComputeModeExclusiveProcess)
	}

	// One daemon, for the shared GPU, told the share's limits.
	seenA := parseReport(t, logsA)
	mem, err := strconv.ParseInt(seenA.env[topology.EnvShareMemory], 10, 64)
	if err != nil {
		t.Fatalf("share container: %s=%q: %v", topology.EnvShareMemory, seenA.env[topology.EnvShareMemory], err)
	}
	events := readRecord(t, record)
	if len(events) == 0 {
		t.Fatal("the stand-in recorded nothing: no MPS daemon was started")
	}
	daemon := events[0].PID
	want := []mpstest.Event{
		{Kind: mpstest.Start, VisibleDevices: uuid, PipeDir: pipe, LogDir: logDir, PID: daemon},
		{Kind: mpstest.Command, VisibleDevices: uuid, PipeDir: pipe, LogDir: logDir, Command: "set_default_active_thread_percentage 25"},
		{Kind: mpstest.Command, VisibleDevices: uuid, PipeDir: pipe, LogDir: logDir, Command: "set_default_device_pinned_mem_limit 0 " + strconv.FormatInt(mem>>20, 10) + "M"},
	}
	if diff := cmp.Diff(want, events); diff != "" {
		t.Errorf("MPS control stand-in record after two quarters of %s and a whole GPU (-want +got):\n%s", shared, diff)
	}

	// The pipe directory is in the share containers, and only there.
	for name, logs := range map[string]string{"mps-a": logsA, "mps-b": logsB} {
		seen := parseReport(t, logs)
		if _, ok := seen.mounts[topology.MPSContainerPipeDir]; !ok {
			t.Errorf("pod %s: no mount at %s; mounts: %v", name, topology.MPSContainerPipeDir, seen.mounts)
		}
		if got := section(logs, "pid"); got != daemon {
			t.Errorf("pod %s: %s/%s reads %q, want the daemon's pid %s", name, topology.MPSContainerPipeDir, mps.PidFile, got, daemon)
		}
		// The daemon's /dev/shm is the container's.
		if got := section(logs, "shm"); got != daemon {
			t.Errorf("pod %s: %s/%s reads %q, want the daemon's pid %s (the daemon and its clients share /dev/shm)", name, topology.MPSContainerShmDir, mpstest.ShmMarker, got, daemon)
		}
		// ... a tmpfs the plugin mounted, of the default size, over the
		// runtime's own (the last mount at the path is the one seen).
		if f := strings.Fields(lastLine(section(logs, "shmmount"))); len(f) < 4 || f[0] != mps.ShmSource || f[2] != "tmpfs" || !strings.Contains(f[3], "size=1048576k") {
			t.Errorf("pod %s: %s is %q; want the plugin's %s tmpfs, size=1048576k (--mps-shm-size 1Gi)", name, topology.MPSContainerShmDir, section(logs, "shmmount"), mps.ShmSource)
		}
		if got := seen.env[topology.EnvMPSPipeDirectory]; got != topology.MPSContainerPipeDir {
			t.Errorf("pod %s: %s=%q, want %s", name, topology.EnvMPSPipeDirectory, got, topology.MPSContainerPipeDir)
		}
	}
	seenWhole := parseReport(t, logsWhole)
	if m, ok := seenWhole.mounts[topology.MPSContainerPipeDir]; ok {
		t.Errorf("pod %s (a whole GPU) has %s mounted: %v", whole.Name, topology.MPSContainerPipeDir, m)
	}
	if got := section(logsWhole, "shm"); got != "" {
		t.Errorf("pod %s (a whole GPU) reads %q from %s/%s; want the runtime's own /dev/shm, without it", whole.Name, got, topology.MPSContainerShmDir, mpstest.ShmMarker)
	}
	if got := section(logsWhole, "shmmount"); strings.Contains(got, mps.ShmSource+" ") {
		t.Errorf("pod %s (a whole GPU) has the MPS tmpfs at %s: %q", whole.Name, topology.MPSContainerShmDir, got)
	}
	shm := layout.ShmDir(uuid)
	if mounted, err := mps.IsShmMounted(shm); !mounted || err != nil {
		t.Errorf("on the host %s is no tmpfs while the daemon runs (%v)", shm, err)
	}
	if v, ok := seenWhole.env[topology.EnvMPSPipeDirectory]; ok {
		t.Errorf("pod %s (a whole GPU) has %s=%s", whole.Name, topology.EnvMPSPipeDirectory, v)
	}

	// A restart of the plugin finds the running daemon.
	if err := lc.StopPlugin(node); err != nil {
		t.Fatal(err)
	}
	if err := lc.StartPluginWith(node, flag); err != nil {
		t.Fatal(err)
	}
	if got := readRecord(t, record); len(got) != len(events) {
		t.Errorf("after a plugin restart the stand-in recorded %v more; want nothing (the daemon runs on)", got[len(events):])
	}
	if !running(daemon) {
		t.Errorf("the daemon (pid %s) is gone after a plugin restart", daemon)
	}

	// One share gone: the daemon stays for the other.
	deletePod(t, a.Name)
	framework.Eventually(t, time.Minute, "claim of mps-a unprepared", func() (bool, string) {
		return framework.Unprepared(lc, node, string(claimA.UID))
	})
	if !running(daemon) {
		t.Errorf("the daemon (pid %s) stopped while pod mps-b holds a share", daemon)
	}
	for _, e := range readRecord(t, record)[len(events):] {
		if e.Kind != mpstest.Command || !strings.HasPrefix(e.Command, "set_default_") {
			t.Errorf("after one of two shares went: stand-in recorded %+v; want at most new defaults", e)
		}
	}

	// The last share gone: quit, the daemon ends, its directory goes.
	deletePod(t, b.Name)
	framework.Eventually(t, time.Minute, "claim of mps-b unprepared", func() (bool, string) {
		return framework.Unprepared(lc, node, string(claimB.UID))
	})
	framework.Eventually(t, time.Minute, "MPS daemon of "+uuid+" stopped", func() (bool, string) {
		all := readRecord(t, record)
		last := all[len(all)-1]
		return last.Kind == mpstest.Exit && last.PID == daemon && !running(daemon), "record ends " + last.Kind + " " + last.Command
	})
	all := readRecord(t, record)
	if quit := all[len(all)-2]; quit.Kind != mpstest.Command || quit.Command != mps.CmdQuit || quit.VisibleDevices != uuid || quit.PipeDir != pipe {
		t.Errorf("before the daemon ended the stand-in recorded %+v; want quit sent to %s's daemon", quit, uuid)
	}
	// After the daemon ends the plugin puts the compute mode back, then
	// unmounts the tmpfs and removes the directory, in that order.
	framework.Eventually(t, time.Minute, "MPS directory of "+uuid+" removed", func() (bool, string) {
		_, err := os.Stat(filepath.Dir(pipe))
		return errors.Is(err, os.ErrNotExist), fmt.Sprintf("stat: %v", err)
	})
	if mounts, err := os.ReadFile("/proc/self/mountinfo"); err != nil || strings.Contains(string(mounts), " "+shm+" ") {
		t.Errorf("the MPS tmpfs %s is still mounted after its directory went (%v)", shm, err)
	}
	if got := readMode(t, modeFile); got != gpu.ComputeModeDefault {
		t.Errorf("compute mode of %s after its MPS directory went: %q, want %s back", shared, got, gpu.ComputeModeDefault)
	}
}

// readMode reads a simulated GPU's compute mode as the plugin left it.
func readMode(t *testing.T, file string) gpu.ComputeMode {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("compute mode of the simulated GPU: %v", err)
	}
	return gpu.ComputeMode(strings.TrimSpace(string(data)))
}

func readRecord(t *testing.T, path string) []mpstest.Event {
	t.Helper()
	events, err := mpstest.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	return events
}

// section is the text of a report's section, trimmed.
func section(logs, name string) string {
	_, rest, ok := strings.Cut(logs, "@@"+name+"\n")
	if !ok {
		return ""
	}
	text, _, _ := strings.Cut(rest, "@@")
	return strings.TrimSpace(text)
}

// lastLine is the last line of text.
func lastLine(text string) string {
	return text[strings.LastIndexByte(text, '\n')+1:]
}

// running says whether pid is a live process (not a zombie).
func running(pid string) bool {
	stat, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(stat), ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] != 'Z'
}

// noClaimPrepared says whether the node's plugin holds no prepared claim,
// for framework.Eventually.
func noClaimPrepared() (bool, string) {
	cp, err := framework.LoadCheckpoint(lc, node)
	if err != nil {
		return false, err.Error()
	}
	return len(cp.Claims) == 0, fmt.Sprintf("%d claims prepared", len(cp.Claims))
}
