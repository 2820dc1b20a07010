// Command localcluster builds and runs a local Kubernetes cluster for the
// gputopo demo and e2e tests: a real control plane, real kubelets on a fake
// container runtime, and fake nodes. No Docker needed.
//
//	localcluster build [--out DIR] [--force]
//	localcluster up --topology FILE --dir DIR [--plugin-bin PATH] [--foreground]
//	localcluster down --dir DIR
//	localcluster plugin start|stop|kill|restart --dir DIR --node NODE
//	localcluster fakecri --socket PATH --record FILE
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	cluster "github.com/gputopo/gputopo/test/cluster"
)

const usage = `usage:
  localcluster build [--out DIR] [--force]
  localcluster up --topology FILE --dir DIR [--plugin-bin PATH] [--bin-dir DIR] [--foreground]
  localcluster down --dir DIR
  localcluster plugin start|stop|kill|restart --dir DIR --node NODE
  localcluster fakecri --socket PATH --record FILE
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "build":
		err = runBuild(ctx, os.Args[2:])
	case "up":
		err = runUp(ctx, os.Args[2:])
	case "down":
		err = runDown(os.Args[2:])
	case "plugin":
		err = runPlugin(os.Args[2:])
	case "fakecri":
		err = runFakeCRI(ctx, os.Args[2:])
	case "-h", "--help", "help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "unknown command %q\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "localcluster %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func runBuild(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("build", flag.ExitOnError)
	out := fs.String("out", cluster.DefaultBinDir(), "directory for the binaries (env GPUTOPO_K8S_BIN)")
	force := fs.Bool("force", false, "rebuild binaries that are current")
	fs.Parse(args)
	return cluster.Build(ctx, cluster.BuildOptions{OutDir: *out, Force: *force})
}

func runUp(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("up", flag.ExitOnError)
	topology := fs.String("topology", "", "topology file (YAML)")
	dir := fs.String("dir", "", "cluster directory")
	pluginBin := fs.String("plugin-bin", "", "gputopo kubelet plugin binary; none started if empty")
	binDir := fs.String("bin-dir", cluster.DefaultBinDir(), "Kubernetes binaries (env GPUTOPO_K8S_BIN)")
	controllerBin := fs.String("controller-bin", "", "gputopo controller binary; none started if empty")
	var manifests stringList
	fs.Var(&manifests, "manifest", "file or directory applied before the controller starts (repeatable)")
	foreground := fs.Bool("foreground", false, "supervise in this process instead of daemonizing")
	timeout := fs.Duration("timeout", 5*time.Minute, "how long to wait for the cluster to be ready")
	fs.Parse(args)
	if *topology == "" || *dir == "" {
		return errors.New("--topology and --dir are required")
	}
	absDir, err := filepath.Abs(*dir)
	if err != nil {
		return fmt.Errorf("resolve --dir: %w", err)
	}
	nodes, err := cluster.LoadTopology(*topology)
	if err != nil {
		return err
	}
	for i, m := range manifests {
		if manifests[i], err = filepath.Abs(m); err != nil {
			return fmt.Errorf("resolve --manifest: %w", err)
		}
	}
	cfg := cluster.Config{Dir: absDir, BinDir: *binDir, Nodes: nodes, PluginBin: *pluginBin, Timeout: *timeout,
		ControllerBin: *controllerBin, Manifests: manifests}
	if err := cfg.Validate(); err != nil {
		return err
	}
	if !*foreground {
		return daemonize(absDir, *timeout)
	}
	c, err := cluster.Start(ctx, cfg)
	if err != nil {
		os.WriteFile(filepath.Join(absDir, "failed"), []byte(err.Error()+"\n"), 0o644)
		return err
	}
	c.Watch(ctx) // until SIGTERM or SIGINT
	fmt.Fprintln(os.Stderr, "stopping the cluster")
	c.Stop()
	return nil
}

// daemonize runs this command again with --foreground in a new session,
// detached from the terminal, and returns once DIR/ready or DIR/failed exists.
func daemonize(dir string, timeout time.Duration) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create cluster dir: %w", err)
	}
	if pid := cluster.RunningPID(dir); pid != 0 {
		return fmt.Errorf("a cluster (pid %d) is already running in %s; run down first", pid, dir)
	}
	os.Remove(filepath.Join(dir, "failed"))
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable: %w", err)
	}
	logPath := filepath.Join(dir, "localcluster.log")
	log, err := os.Create(logPath)
	if err != nil {
		return fmt.Errorf("create supervisor log: %w", err)
	}
	defer log.Close()
	cmd := exec.Command(self, append([]string{"up", "--foreground"}, os.Args[2:]...)...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start supervisor: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	fmt.Fprintf(os.Stderr, "starting cluster in %s (supervisor pid %d, log %s)\n", dir, cmd.Process.Pid, logPath)
	deadline := time.After(timeout + 30*time.Second)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-exited:
			return fmt.Errorf("supervisor exited (%v) before the cluster was ready:\n%s", err, failure(dir, logPath))
		case <-deadline:
			cmd.Process.Signal(syscall.SIGTERM)
			return fmt.Errorf("cluster not ready after %s:\n%s", timeout, failure(dir, logPath))
		case <-tick.C:
		}
		if _, err := os.Stat(filepath.Join(dir, "ready")); err == nil {
			fmt.Fprintf(os.Stderr, "cluster ready: export KUBECONFIG=%s\n", filepath.Join(dir, "kubeconfig"))
			return nil
		}
		if _, err := os.Stat(filepath.Join(dir, "failed")); err == nil {
			<-exited
			return fmt.Errorf("%s", failure(dir, logPath))
		}
	}
}

// failure explains a failed start: the error the supervisor recorded, which
// carries the tail of the failing process's log, else the supervisor's log.
func failure(dir, logPath string) string {
	if data, err := os.ReadFile(filepath.Join(dir, "failed")); err == nil {
		return strings.TrimSpace(string(data))
	}
	data, _ := os.ReadFile(logPath)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	return strings.Join(lines, "\n")
}

func runDown(args []string) error {
	fs := flag.NewFlagSet("down", flag.ExitOnError)
	dir := fs.String("dir", "", "cluster directory")
	fs.Parse(args)
	if *dir == "" {
		return errors.New("--dir is required")
	}
	return cluster.Down(*dir)
}

func runFakeCRI(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("fakecri", flag.ExitOnError)
	socket := fs.String("socket", "", "unix socket to serve CRI on")
	record := fs.String("record", "", "file to append CreateContainer records to (JSON lines)")
	fs.Parse(args)
	if *socket == "" || *record == "" {
		return errors.New("--socket and --record are required")
	}
	f, err := cluster.StartFakeCRI(*socket, *record)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "fake CRI serving on %s, recording to %s\n", *socket, *record)
	<-ctx.Done()
	f.Stop()
	return nil
}

func runPlugin(args []string) error {
	if len(args) == 0 {
		return errors.New("want start, stop, kill or restart")
	}
	fs := flag.NewFlagSet("plugin", flag.ExitOnError)
	dir := fs.String("dir", "", "cluster directory")
	node := fs.String("node", "", "real node whose plugin to drive")
	fs.Parse(args[1:])
	if *dir == "" || *node == "" {
		return errors.New("--dir and --node are required")
	}
	c, err := cluster.Attach(*dir)
	if err != nil {
		return err
	}
	switch args[0] {
	case "start":
		return c.StartPlugin(*node)
	case "stop":
		return c.StopPlugin(*node)
	case "kill":
		return c.KillPlugin(*node)
	case "restart":
		return c.RestartPlugin(*node)
	}
	return fmt.Errorf("unknown plugin action %q: want start, stop, kill or restart", args[0])
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }
