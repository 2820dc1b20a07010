package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is a process the harness started. Every process gets its own process
// group (so a stop also reaches its children), a log file DIR/logs/NAME.log
// and a pid file DIR/run/NAME.pid holding "PID STARTTIME", so that `down` and
// an attached Cluster can stop it without mistaking a reused PID for it.
type proc struct {
	name    string
	logFile string
	pidFile string
	pid     int
	// argv and opts started the process; nil when found through its pid
	// file. relaunch starts them again.
	argv []string
	opts procOpts

	cmd  *exec.Cmd // nil when found through its pid file
	done chan struct{}
	mu   sync.Mutex
	err  error
}

type procOpts struct {
	workDir string
	env     []string
	// ownedByParent kills the process when the harness process dies.
	ownedByParent bool
}

func startProc(dir, name string, argv []string, opts procOpts) (*proc, error) {
	logFile := filepath.Join(dir, "logs", name+".log")
	pidFile := filepath.Join(dir, "run", name+".pid")
	for _, d := range []string{filepath.Dir(logFile), filepath.Dir(pidFile)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("start %s: %w", name, err)
		}
	}
	log, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log of %s: %w", name, err)
	}
	defer log.Close()
	fmt.Fprintf(log, "==== %s starting: %s\n", time.Now().Format(time.RFC3339), strings.Join(argv, " "))

	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = opts.workDir
	cmd.Env = append(os.Environ(), opts.env...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if opts.ownedByParent {
		cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, logFile: logFile, pidFile: pidFile, pid: cmd.Process.Pid, argv: argv, opts: opts, cmd: cmd, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.done)
	}()
	start, err := procStartTime(p.pid)
	if err == nil {
		err = os.WriteFile(pidFile, []byte(fmt.Sprintf("%d %d\n", p.pid, start)), 0o644)
	}
	if err != nil {
		p.kill(time.Second)
		return nil, fmt.Errorf("record pid of %s: %w", name, err)
	}
	return p, nil
}

// procFromPidFile finds a running process by its pid file; nil if it is not running.
func procFromPidFile(pidFile string) *proc {
	data, err := os.ReadFile(pidFile)
	if err != nil {
		return nil
	}
	var pid int
	var start uint64
	if _, err := fmt.Sscanf(string(data), "%d %d", &pid, &start); err != nil || pid <= 0 {
		return nil
	}
	if got, err := procStartTime(pid); err != nil || got != start || !alive(pid) {
		return nil
	}
	name := strings.TrimSuffix(filepath.Base(pidFile), ".pid")
	return &proc{name: name, pidFile: pidFile, pid: pid,
		logFile: filepath.Join(filepath.Dir(filepath.Dir(pidFile)), "logs", name+".log")}
}

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	if p.done != nil {
		select {
		case <-p.done:
			return true
		default:
			return false
		}
	}
	return !alive(p.pid)
}

// exitErr returns how an owned process ended.
func (p *proc) exitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// stop sends SIGTERM to the process group, then SIGKILL after timeout, and
// waits for the process to end.
func (p *proc) stop(timeout time.Duration) {
	if p.exited() {
		p.signalGroup(syscall.SIGKILL) // stray children of a dead leader
		p.removePidFile()
		return
	}
	p.signalGroup(syscall.SIGTERM)
	if !p.wait(timeout) {
		p.signalGroup(syscall.SIGKILL)
		p.wait(10 * time.Second)
	}
	p.signalGroup(syscall.SIGKILL)
	p.removePidFile()
}

// removePidFile removes the pid file if it still names this process: a
// newer process of the same name may have replaced it.
func (p *proc) removePidFile() {
	data, err := os.ReadFile(p.pidFile)
	if err != nil {
		return
	}
	var pid int
	if _, err := fmt.Sscanf(string(data), "%d", &pid); err == nil && pid != p.pid {
		return
	}
	os.Remove(p.pidFile)
}

// kill sends SIGKILL to the process group and waits up to timeout.
func (p *proc) kill(timeout time.Duration) {
	p.signalGroup(syscall.SIGKILL)
	p.wait(timeout)
	p.removePidFile()
}

// signalGroup signals the process group, or the process alone if it left
// its group. An ended leader's pid is only used as a group id: Linux does not
// reuse a pid while a group of that id exists, so this never hits a stranger.
func (p *proc) signalGroup(sig syscall.Signal) {
	if err := syscall.Kill(-p.pid, sig); errors.Is(err, syscall.ESRCH) && !p.exited() {
		syscall.Kill(p.pid, sig)
	}
}

func (p *proc) wait(timeout time.Duration) bool {
	if p.done != nil {
		select {
		case <-p.done:
			return true
		case <-time.After(timeout):
			return false
		}
	}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if !alive(p.pid) {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return !alive(p.pid)
}

// alive reports whether pid is a live (not zombie) process.
func alive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	fields := statFields(data)
	return len(fields) > 0 && fields[0] != "Z" && fields[0] != "X"
}

// procStartTime returns field 22 of /proc/PID/stat, the start time in clock ticks.
func procStartTime(pid int) (uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	fields := statFields(data)
	if len(fields) < 20 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	return strconv.ParseUint(fields[19], 10, 64)
}

// statFields returns the fields of /proc/PID/stat after the command name,
// starting with the state (field 3).
func statFields(data []byte) []string {
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(data[i+1:]))
}

// tailFile returns the last n lines of a file, for error messages.
func tailFile(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
