// Package mps runs one CUDA MPS control daemon per shared GPU, the way
// NVIDIA's tools start it: nvidia-cuda-mps-control -d with
// CUDA_VISIBLE_DEVICES naming that GPU and its own pipe and log
// directories, the default limits sent through its control interface, and
// "quit" to stop it.
//
// The daemons' directories under Root are the record of what runs: each
// GPU's directory holds the pipe directory (where the daemon writes its pid
// file) and the limits last sent, so a restarted plugin finds its daemons,
// starts the ones that died, and stops the ones nothing needs any more,
// never starting a second daemon for a GPU.
//
// As NVIDIA's DRA driver does, a GPU is put into the EXCLUSIVE_PROCESS
// compute mode before its daemon starts, so the MPS server is the GPU's one
// process and a process that bypasses MPS cannot use the GPU; the mode it
// had is recorded beside the daemon's state and set again once the daemon
// is stopped, by this plugin or by a restarted one.
package mps

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/gputopo/gputopo/pkg/gpu"
	"github.com/gputopo/gputopo/pkg/topology"
)

// Names of the control program and the environment it reads.
const (
	// ControlName is the MPS control program of the NVIDIA driver.
	ControlName = "nvidia-cuda-mps-control"
	// PidFile is what the control daemon writes into its pipe directory.
	PidFile = ControlName + ".pid"

	// Commands sent to a running daemon.
	CmdActiveThreadPercentage = "set_default_active_thread_percentage"
	CmdPinnedMemLimit         = "set_default_device_pinned_mem_limit"
	CmdQuit                   = "quit"

	pipeDir    = "pipe"
	logDir     = "log"
	shmDir     = "shm"
	limitsFile = "limits.json"
	// uuidFile names the GPU of a daemon directory, which is named by the
	// first eight hex digits of the GPU's UUID (see dir).
	uuidFile = "uuid"
	// modeFile holds the compute mode the GPU had before its daemon.
	modeFile = "previous-compute-mode"
)

// MaxPipeDir is the longest pipe directory the control daemon was seen to
// start with. It binds Unix sockets in the directory (control,
// control_privileged), whose paths the kernel caps at 108 bytes: with
// driver 580.159.04 on an H200, a pipe directory of 85 bytes worked and
// one of 88 bytes made `nvidia-cuda-mps-control -d` exit 1 printing
// nothing. A start that fails with a longer one says so.
const MaxPipeDir = 85

// ErrNoControl is returned when the control program cannot be run.
var ErrNoControl = errors.New("MPS control program not found")

// Limits are a daemon's defaults for the MPS servers it starts.
type Limits struct {
	// ActiveThreadPercentage is the share of the GPU's SMs, 1 to 100.
	ActiveThreadPercentage int64 `json:"activeThreadPercentage"`
	// PinnedMemoryBytes is the device memory a client may pin; 0 sets
	// none.
	PinnedMemoryBytes int64 `json:"pinnedMemoryBytes"`
}

// Commands are the control commands that set l, in the order sent.
// CUDA_VISIBLE_DEVICES names one GPU, which the daemon sees as device 0.
func (l Limits) Commands() []string {
	out := []string{CmdActiveThreadPercentage + " " + strconv.FormatInt(l.ActiveThreadPercentage, 10)}
	if l.PinnedMemoryBytes > 0 {
		out = append(out, fmt.Sprintf("%s 0 %dM", CmdPinnedMemLimit, l.PinnedMemoryBytes>>20))
	}
	return out
}

// Config says where the control program and the daemons' files are.
type Config struct {
	// ControlPath is the control program as this process sees it.
	ControlPath string
	// Root holds a directory per daemon, named by GPU UUID. Containers'
	// pipe directory mounts name paths under it, so the host must see it
	// at the same path (the kubelet plugin directory is).
	Root string
	// LibraryPath, when set, is LD_LIBRARY_PATH for the control program
	// (the driver's libraries where this process is not the host).
	LibraryPath string
	// Launcher, when set, is this program's own executable, which calls
	// Launch first thing: the daemon is then started through it in a mount
	// namespace of its own whose /dev/shm is the GPU's ShmDir, as the MPS
	// server and its clients must share /dev/shm (needs CAP_SYS_ADMIN).
	// Empty: the daemon runs with this process's /dev/shm.
	Launcher string
	// ShmSize, when set, makes each GPU's ShmDir a tmpfs of that size (in
	// bytes, or "50%" of the node's memory), as /dev/shm is, mounted
	// when its daemon starts and unmounted when it stops (needs
	// CAP_SYS_ADMIN; the host sees it only if this process's mounts
	// propagate to the host: the chart mounts the plugin directory
	// Bidirectional). Empty: a plain directory on the plugin directory's
	// file system.
	ShmSize string
	// ComputeModes, when set, is how the GPUs' compute modes are read and
	// set: EXCLUSIVE_PROCESS while a daemon runs, the mode before it once
	// it is stopped. Nil leaves them alone.
	ComputeModes gpu.ComputeModes
	// StartTimeout bounds the wait for a started daemon's pid file, and
	// StopTimeout the wait for a daemon told to quit; 0 means 30 s.
	StartTimeout, StopTimeout time.Duration
}

// Manager starts, finds and stops the daemons. It is not safe for
// concurrent use: its caller (the plugin's state) serialises calls.
type Manager struct {
	cfg Config
}

// New returns a Manager; it runs nothing until Sync.
func New(cfg Config) (*Manager, error) {
	if !filepath.IsAbs(cfg.ControlPath) || !filepath.IsAbs(cfg.Root) {
		return nil, fmt.Errorf("MPS control program %q and daemon directory %q must be absolute paths", cfg.ControlPath, cfg.Root)
	}
	if err := ValidShmSize(cfg.ShmSize); err != nil {
		return nil, err
	}
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = 30 * time.Second
	}
	if cfg.StopTimeout == 0 {
		cfg.StopTimeout = 30 * time.Second
	}
	return &Manager{cfg: cfg}, nil
}

// ComputeModes is what sets the GPUs' compute modes; nil for none.
func (m *Manager) ComputeModes() gpu.ComputeModes { return m.cfg.ComputeModes }

// ControlPath is the control program the manager runs.
func (m *Manager) ControlPath() string { return m.cfg.ControlPath }

// dir is a GPU's daemon directory: Root/<the first eight hex digits of
// its UUID>, short so that the pipe directory's socket paths fit
// (MaxPipeDir) under the kubelet's plugin directory, or Root/<UUID>, where
// a daemon of an earlier version runs on.
func (m *Manager) dir(uuid string) string {
	legacy := filepath.Join(m.cfg.Root, uuid)
	if _, err := os.Stat(legacy); err == nil {
		return legacy
	}
	return filepath.Join(m.cfg.Root, shortName(uuid))
}

// shortName is a UUID's eight hex digits after "GPU-", or the UUID when it
// has no such form.
func shortName(uuid string) string {
	if hex, ok := strings.CutPrefix(uuid, "GPU-"); ok && len(hex) >= 8 && !strings.ContainsAny(hex[:8], "-/") {
		return hex[:8]
	}
	return uuid
}

// uuidOf is the GPU whose daemon directory Root/name is: the UUID its
// uuid file records, or name itself (an earlier version's directory, or a
// record that is missing or does not name a GPU of that directory).
func (m *Manager) uuidOf(name string) string {
	data, err := os.ReadFile(filepath.Join(m.cfg.Root, name, uuidFile))
	if err != nil {
		return name
	}
	uuid := strings.TrimSpace(string(data))
	if checkUUID(uuid) != nil || shortName(uuid) != name {
		return name
	}
	return uuid
}

// recorded is the GPU whose record holds daemon directory d, "" when
// none does.
func (m *Manager) recorded(d string) string {
	name := filepath.Base(d)
	if uuid := m.uuidOf(name); uuid != name {
		return uuid
	}
	return ""
}

// errAlike refuses uuid the daemon directory d that owner holds.
func errAlike(uuid, d, owner string) error {
	return fmt.Errorf("GPU %s gets no MPS control daemon: its MPS directory %s is GPU %s's (their UUIDs begin alike); share one of them only", uuid, d, owner)
}

// mkdir creates a GPU's daemon directory with the record of its UUID,
// moving the directory an earlier version named by the whole UUID to its
// short name where no daemon runs from it (the record of the GPU's mode
// moves with it). It refuses a directory another GPU's record holds.
func (m *Manager) mkdir(ctx context.Context, uuid string) error {
	legacy, short := filepath.Join(m.cfg.Root, uuid), filepath.Join(m.cfg.Root, shortName(uuid))
	if legacy != short && m.Running(uuid) == 0 {
		if _, err := os.Stat(legacy); err == nil {
			if _, err := os.Stat(short); errors.Is(err, fs.ErrNotExist) {
				if err := os.Rename(legacy, short); err != nil {
					klog.FromContext(ctx).Info("MPS directory of an earlier version kept", "gpu", uuid, "path", legacy, "err", err)
				}
			}
		}
	}
	d := m.dir(uuid)
	owner := m.recorded(d)
	if owner != "" && owner != uuid {
		return errAlike(uuid, d, owner)
	}
	if err := os.MkdirAll(d, 0o755); err != nil {
		return fmt.Errorf("create MPS directory of GPU %s: %w", uuid, err)
	}
	if owner == uuid || filepath.Base(d) == uuid {
		return nil
	}
	// Written whole or not at all: a torn record would name no GPU.
	tmp := filepath.Join(d, uuidFile+".tmp")
	if err := os.WriteFile(tmp, []byte(uuid+"\n"), 0o644); err != nil {
		return fmt.Errorf("create MPS directory of GPU %s: %w", uuid, err)
	}
	if err := os.Rename(tmp, filepath.Join(d, uuidFile)); err != nil {
		return fmt.Errorf("create MPS directory of GPU %s: %w", uuid, err)
	}
	return nil
}

// PipeDir is the host directory of a GPU's daemon pipes, which its
// shares' containers get at topology.MPSContainerPipeDir.
func (m *Manager) PipeDir(uuid string) string { return filepath.Join(m.dir(uuid), pipeDir) }

// ShmDir is the directory a GPU's daemon (with Config.Launcher) and its
// shares' containers see as /dev/shm.
func (m *Manager) ShmDir(uuid string) string { return filepath.Join(m.dir(uuid), shmDir) }

// SharesShm says whether the daemons see ShmDir as /dev/shm, so that the
// containers must too.
func (m *Manager) SharesShm() bool { return m.cfg.Launcher != "" }

// LogDir is where a GPU's daemon logs.
func (m *Manager) LogDir(uuid string) string { return filepath.Join(m.dir(uuid), logDir) }

// Sync makes the running daemons those of want (limits by GPU UUID): it
// stops and removes every other daemon found under Root, starts each
// wanted one that does not run, and sends limits a running one was not
// given yet. It goes on past a failure and returns them all.
func (m *Manager) Sync(ctx context.Context, want map[string]Limits) error {
	var errs []error
	entries, err := os.ReadDir(m.cfg.Root)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("list MPS daemons in %s: %w", m.cfg.Root, err)
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		uuid := m.uuidOf(e.Name())
		if _, ok := want[uuid]; ok {
			continue
		}
		if err := m.stop(ctx, uuid); err != nil {
			errs = append(errs, err)
		}
	}
	// A directory two wanted GPUs would share (their UUIDs begin alike)
	// stays the one's its record names, else the first's in order.
	owner := map[string]string{}
	for _, uuid := range slices.Sorted(maps.Keys(want)) {
		d := m.dir(uuid)
		if rec := m.recorded(d); rec != "" {
			owner[d] = rec
		}
	}
	for _, uuid := range slices.Sorted(maps.Keys(want)) {
		d := m.dir(uuid)
		if other, ok := owner[d]; ok && other != uuid {
			errs = append(errs, errAlike(uuid, d, other))
			continue
		}
		owner[d] = uuid
		if err := m.ensure(ctx, uuid, want[uuid]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Running returns the pid of a GPU's daemon, 0 when none runs.
func (m *Manager) Running(uuid string) int {
	data, err := os.ReadFile(filepath.Join(m.PipeDir(uuid), PidFile))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 || !m.isDaemon(pid) {
		return 0
	}
	return pid
}

// isDaemon says whether pid is a live control program, not a zombie and
// not another program that got the pid of a daemon gone since (after a
// reboot, say).
func (m *Manager) isDaemon(pid int) bool {
	proc := "/proc/" + strconv.Itoa(pid)
	stat, err := os.ReadFile(proc + "/stat")
	if err != nil {
		return false
	}
	// The state follows the parenthesised command, which may hold spaces.
	if i := bytes.LastIndexByte(stat, ')'); i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' || stat[i+2] == 'X' {
		return false
	}
	if exe, err := os.Readlink(proc + "/exe"); err == nil && exe == m.cfg.ControlPath {
		return true
	}
	// A script runs as its interpreter, with its path among the arguments.
	cmdline, err := os.ReadFile(proc + "/cmdline")
	if err != nil {
		return false
	}
	return slices.Contains(strings.Split(string(cmdline), "\x00"), m.cfg.ControlPath)
}

func (m *Manager) env(uuid string) []string {
	env := []string{
		"PATH=" + filepath.Dir(m.cfg.ControlPath) + ":/usr/sbin:/usr/bin:/sbin:/bin",
		topology.EnvCUDAVisibleDevices + "=" + uuid,
		topology.EnvMPSPipeDirectory + "=" + m.PipeDir(uuid),
		topology.EnvMPSLogDirectory + "=" + m.LogDir(uuid),
	}
	if m.cfg.LibraryPath != "" {
		env = append(env, "LD_LIBRARY_PATH="+m.cfg.LibraryPath)
	}
	return env
}

// ensure starts a GPU's daemon unless it runs, and sends it limits it
// was not given.
func (m *Manager) ensure(ctx context.Context, uuid string, want Limits) error {
	if err := checkUUID(uuid); err != nil {
		return err
	}
	logger := klog.FromContext(ctx)
	pid := m.Running(uuid)
	// Before a daemon starts, and again for one that runs (a mode changed
	// behind its back, or a plugin stopped between setting it and
	// starting the daemon).
	if err := m.exclusive(ctx, uuid); err != nil {
		return err
	}
	if pid == 0 {
		if err := m.start(ctx, uuid); err != nil {
			return err
		}
		pid = m.Running(uuid)
		logger.Info("Started MPS control daemon", "gpu", uuid, "pid", pid, "pipeDirectory", m.PipeDir(uuid))
	} else if have, err := m.applied(uuid); err == nil && have == want {
		return nil
	}
	for _, c := range want.Commands() {
		if err := m.control(ctx, uuid, c); err != nil {
			return err
		}
	}
	data, err := json.Marshal(want)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(m.dir(uuid), limitsFile), data, 0o644); err != nil {
		return fmt.Errorf("record MPS limits of GPU %s: %w", uuid, err)
	}
	logger.V(2).Info("Set MPS default limits", "gpu", uuid, "pid", pid, "activeThreadPercentage", want.ActiveThreadPercentage, "pinnedMemoryBytes", want.PinnedMemoryBytes)
	return nil
}

func (m *Manager) applied(uuid string) (Limits, error) {
	var l Limits
	data, err := os.ReadFile(filepath.Join(m.dir(uuid), limitsFile))
	if err != nil {
		return l, err
	}
	return l, json.Unmarshal(data, &l)
}

func checkUUID(uuid string) error {
	if uuid == "" || uuid == "." || uuid == ".." || strings.ContainsAny(uuid, "/\x00") {
		return fmt.Errorf("GPU UUID %q cannot name an MPS daemon directory", uuid)
	}
	return nil
}

func (m *Manager) checkControl() error {
	fi, err := os.Stat(m.cfg.ControlPath)
	if err == nil && (fi.IsDir() || fi.Mode()&0o111 == 0) {
		err = errors.New("not an executable file")
	}
	if err != nil {
		return fmt.Errorf("%w: %s: %v; shared GPUs need the NVIDIA driver's %s (set --mps-control-path, or the chart's nvml.mpsControlPath, to where it is)", ErrNoControl, m.cfg.ControlPath, err, ControlName)
	}
	return nil
}

// start runs the control program as a daemon and waits for its pid file.
// A pipe directory a dead daemon left is emptied, not replaced: containers
// that still hold its mount see the new daemon's pipes.
func (m *Manager) start(ctx context.Context, uuid string) error {
	if err := m.checkControl(); err != nil {
		return err
	}
	if err := m.mkdir(ctx, uuid); err != nil {
		return err
	}
	for _, d := range []string{m.PipeDir(uuid), m.LogDir(uuid), m.ShmDir(uuid)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create MPS directory of GPU %s: %w", uuid, err)
		}
	}
	// shm is world-writable, as /dev/shm is: clients of any user use it.
	if err := os.Chmod(m.ShmDir(uuid), 0o1777); err != nil {
		return fmt.Errorf("create MPS shm directory of GPU %s: %w", uuid, err)
	}
	if err := m.mountShm(uuid); err != nil {
		return err
	}
	for _, d := range []string{m.PipeDir(uuid), m.ShmDir(uuid)} {
		stale, err := os.ReadDir(d)
		if err != nil {
			return fmt.Errorf("read MPS directory of GPU %s: %w", uuid, err)
		}
		for _, e := range stale {
			if err := os.RemoveAll(filepath.Join(d, e.Name())); err != nil {
				return fmt.Errorf("clear MPS directory of GPU %s: %w", uuid, err)
			}
		}
	}
	_ = os.Remove(filepath.Join(m.dir(uuid), limitsFile))
	// The daemon keeps the output files it inherits: files, not pipes
	// this process would wait on.
	out, err := os.OpenFile(filepath.Join(m.LogDir(uuid), "start.log"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("open MPS start log of GPU %s: %w", uuid, err)
	}
	defer func() { _ = out.Close() }()
	cmd := exec.Command(m.cfg.ControlPath, "-d")
	cmd.Env = m.env(uuid)
	// Its own process group: a signal to the plugin's group is not for it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if m.cfg.Launcher != "" {
		cmd = exec.Command(m.cfg.Launcher, m.cfg.ControlPath, "-d")
		cmd.Env = append(m.env(uuid), launchEnv+"="+m.ShmDir(uuid))
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Unshareflags: syscall.CLONE_NEWNS}
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		hint := ""
		if p := m.PipeDir(uuid); len(p) > MaxPipeDir {
			hint = fmt.Sprintf("; its pipe directory %s is %d bytes long, and the driver's daemon exits at once, saying nothing, with one over %d bytes (the paths of the sockets it binds there are capped at 108 bytes): give the plugin a shorter --kubelet-plugins-directory-path (the chart's kubeletPlugin.kubeletDir)", p, len(p), MaxPipeDir)
		}
		return fmt.Errorf("start MPS control daemon of GPU %s: %s -d: %w%s%s (see %s)", uuid, m.cfg.ControlPath, err, logTail(out.Name()), hint, out.Name())
	}
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, m.cfg.StartTimeout, true, func(context.Context) (bool, error) {
		return m.Running(uuid) != 0, nil
	})
	if err != nil {
		return fmt.Errorf("MPS control daemon of GPU %s did not write %s in %s: %w (see %s)", uuid, filepath.Join(m.PipeDir(uuid), PidFile), m.cfg.StartTimeout, err, m.LogDir(uuid))
	}
	return nil
}

// logTail is the end of a daemon's log, for an error that the kubelet
// shows on the pod, where the node's file cannot be read: ": <last
// lines>", or nothing.
func logTail(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	const max = 512
	text := strings.TrimSpace(string(data))
	if len(text) > max {
		text = "..." + text[len(text)-max:]
	}
	if text == "" {
		return ""
	}
	return ": " + strings.ReplaceAll(text, "\n", "; ")
}

// control sends one command to a GPU's daemon.
func (m *Manager) control(ctx context.Context, uuid, command string) error {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.StartTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, m.cfg.ControlPath)
	cmd.Env = m.env(uuid)
	cmd.Stdin = strings.NewReader(command + "\n")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("MPS control daemon of GPU %s: %q: %w: %s", uuid, command, err, strings.TrimSpace(out.String()))
	}
	return nil
}

// stop tells a GPU's daemon to quit, kills it if it does not, and removes
// its directory.
func (m *Manager) stop(ctx context.Context, uuid string) error {
	if err := checkUUID(uuid); err != nil {
		return err
	}
	logger := klog.FromContext(ctx)
	if pid := m.Running(uuid); pid != 0 {
		if err := m.control(ctx, uuid, CmdQuit); err != nil {
			logger.Error(err, "MPS control daemon did not take quit; killing it", "gpu", uuid, "pid", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		gone := func(context.Context) (bool, error) {
			reap(pid)
			return !m.isDaemon(pid), nil
		}
		if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, m.cfg.StopTimeout, true, gone); err != nil {
			logger.Error(err, "MPS control daemon did not quit; killing it", "gpu", uuid, "pid", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
			if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, m.cfg.StopTimeout, true, gone); err != nil {
				return fmt.Errorf("stop MPS control daemon of GPU %s (pid %d): %w", uuid, pid, err)
			}
		}
		logger.Info("Stopped MPS control daemon", "gpu", uuid, "pid", pid)
	}
	// The directory, with the mode record, stays until the mode is back:
	// the next sync tries again.
	if err := m.restore(ctx, uuid); err != nil {
		return err
	}
	if err := UnmountShm(m.ShmDir(uuid)); err != nil {
		return fmt.Errorf("unmount MPS shm of GPU %s: %w", uuid, err)
	}
	if err := os.RemoveAll(m.dir(uuid)); err != nil {
		return fmt.Errorf("remove MPS directory of GPU %s: %w", uuid, err)
	}
	return nil
}

// ShmSource is the source name of the tmpfs mounted at a GPU's ShmDir, as
// /proc/mounts shows it on the host and in its shares' containers.
const ShmSource = "gputopo-mps-shm"

// mountShm mounts a tmpfs at the GPU's ShmDir unless Config.ShmSize is
// empty or one is there already (a daemon that ran before this process
// restarted, whose clients hold the mount).
func (m *Manager) mountShm(uuid string) error {
	if m.cfg.ShmSize == "" {
		return nil
	}
	dir := m.ShmDir(uuid)
	if mounted, err := IsShmMounted(dir); err != nil || mounted {
		return err
	}
	opts := "mode=1777,size=" + m.cfg.ShmSize
	if err := syscall.Mount(ShmSource, dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount a tmpfs (%s) at the MPS shm directory %s of GPU %s: %w (the plugin needs CAP_SYS_ADMIN for it; set --mps-shm-size=\"\" for a plain directory)", opts, dir, uuid, err)
	}
	return nil
}

// ValidShmSize checks a Config.ShmSize: empty, a number of bytes, or a
// percentage of the node's memory from 1 to 100.
func ValidShmSize(size string) error {
	if size == "" {
		return nil
	}
	n, pct := strings.CutSuffix(size, "%")
	v, err := strconv.ParseUint(n, 10, 64)
	if err != nil || v == 0 || (pct && v > 100) {
		return fmt.Errorf("MPS shm size %q: want a number of bytes or a percentage of the node's memory from 1%% to 100%%", size)
	}
	return nil
}

// tmpfsMagic is TMPFS_MAGIC of statfs(2).
const tmpfsMagic = 0x01021994

// IsShmMounted says whether dir is a tmpfs mount point: a tmpfs whose
// device differs from its parent directory's.
func IsShmMounted(dir string) (bool, error) {
	var fs syscall.Statfs_t
	if err := syscall.Statfs(dir, &fs); err != nil {
		if errors.Is(err, syscall.ENOENT) {
			return false, nil
		}
		return false, fmt.Errorf("statfs %s: %w", dir, err)
	}
	if fs.Type != tmpfsMagic {
		return false, nil
	}
	var self, parent syscall.Stat_t
	if err := syscall.Stat(dir, &self); err != nil {
		return false, fmt.Errorf("stat %s: %w", dir, err)
	}
	if err := syscall.Stat(filepath.Dir(dir), &parent); err != nil {
		return false, fmt.Errorf("stat %s: %w", filepath.Dir(dir), err)
	}
	return self.Dev != parent.Dev, nil
}

// UnmountShm unmounts the tmpfs at dir, if one is mounted there; lazily,
// as a container that still runs may hold it.
func UnmountShm(dir string) error {
	mounted, err := IsShmMounted(dir)
	if err != nil || !mounted {
		return err
	}
	if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
		return fmt.Errorf("unmount %s: %w", dir, err)
	}
	return nil
}

// exclusive puts a GPU into EXCLUSIVE_PROCESS unless it is, recording the
// mode it had unless a record is there already (that of the mode before
// an earlier daemon, which was never set back).
func (m *Manager) exclusive(ctx context.Context, uuid string) error {
	if m.cfg.ComputeModes == nil {
		return nil
	}
	have, err := m.cfg.ComputeModes.ComputeMode(uuid)
	if err != nil {
		return fmt.Errorf("GPU %s gets no MPS control daemon: %w", uuid, err)
	}
	record := filepath.Join(m.dir(uuid), modeFile)
	if _, err := os.Stat(record); errors.Is(err, fs.ErrNotExist) {
		if err := m.mkdir(ctx, uuid); err != nil {
			return err
		}
		if err := os.WriteFile(record, []byte(string(have)+"\n"), 0o644); err != nil {
			return fmt.Errorf("record compute mode of GPU %s: %w", uuid, err)
		}
	} else if err != nil {
		return fmt.Errorf("read compute mode record of GPU %s: %w", uuid, err)
	}
	if have == gpu.ComputeModeExclusiveProcess {
		return nil
	}
	if err := m.cfg.ComputeModes.SetComputeMode(uuid, gpu.ComputeModeExclusiveProcess); err != nil {
		return fmt.Errorf("GPU %s gets no MPS control daemon: %w; the plugin sets EXCLUSIVE_PROCESS so that only the MPS server uses a shared GPU, which needs it to run as root (privileged) with the host's NVIDIA driver (the chart runs it so)", uuid, err)
	}
	klog.FromContext(ctx).Info("Set compute mode for MPS", "gpu", uuid, "mode", gpu.ComputeModeExclusiveProcess, "previous", have)
	return nil
}

// restore sets the compute mode a GPU had before its daemon back, when
// one was recorded, and removes the record.
func (m *Manager) restore(ctx context.Context, uuid string) error {
	record := filepath.Join(m.dir(uuid), modeFile)
	data, err := os.ReadFile(record)
	if errors.Is(err, fs.ErrNotExist) || m.cfg.ComputeModes == nil {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read compute mode record of GPU %s: %w", uuid, err)
	}
	was := gpu.ComputeMode(strings.TrimSpace(string(data)))
	have, err := m.cfg.ComputeModes.ComputeMode(uuid)
	if err == nil && have != was {
		err = m.cfg.ComputeModes.SetComputeMode(uuid, was)
	}
	if err != nil {
		return fmt.Errorf("set GPU %s back to compute mode %s, which it had before its MPS control daemon: %w (kept in %s; the plugin tries again)", uuid, was, err, record)
	}
	if err := os.Remove(record); err != nil {
		return fmt.Errorf("remove compute mode record of GPU %s: %w", uuid, err)
	}
	if have != was {
		klog.FromContext(ctx).Info("Set compute mode back after MPS", "gpu", uuid, "mode", was)
	}
	return nil
}

// reap collects a daemon that exited as this process's child (where the
// plugin is its container's first process, orphans are its children).
func reap(pid int) {
	var ws syscall.WaitStatus
	_, _ = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
}
