// Command localcluster builds and runs a local Kubernetes cluster for the
// gputopo demo and e2e tests: a real control plane, real kubelets on a fake
// container runtime or on containerd, and fake nodes. No Docker needed. `localcluster help`
// lists the subcommands and their flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	cluster "github.com/gputopo/gputopo/test/cluster"
)

// subcommand is one verb of localcluster. setup registers its flags and
// returns what runs it once they are parsed.
type subcommand struct {
	name, args, summary string
	setup               func(fs *flag.FlagSet) func(ctx context.Context, args []string) error
}

var subcommands = []subcommand{
	{"build", "", "build the Kubernetes binaries, etcd and containerd from the Go module proxy", setupBuild},
	{"build-peers", "", "build JobSet, LeaderWorkerSet and Kueue (--peers) from the Go module proxy, with their CRDs and webhook configurations", setupBuildPeers},
	{"up", "", "start a cluster and return when it is ready (--foreground: supervise it here)", setupUp},
	{"down", "", "stop the cluster in --dir; idempotent", setupDown},
	{"plugin", "start|stop|kill|restart", "drive the gputopo kubelet plugin of one real node", setupPlugin},
	{"fakecri", "", "serve the fake container runtime on a unix socket", setupFakeCRI},
	{"bin-dir", "", "print where build puts the Kubernetes binaries (env GPUTOPO_K8S_BIN)", setupBinDir},
	{"versions", "", "list the supported Kubernetes releases, newest first", setupVersions},
}

// usage lists every subcommand with its flags, generated from the flag
// definitions so it cannot go stale.
func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: localcluster COMMAND [flags]")
	for _, sc := range subcommands {
		fs := flag.NewFlagSet(sc.name, flag.ContinueOnError)
		sc.setup(fs)
		synopsis := "localcluster " + sc.name
		if sc.args != "" {
			synopsis += " " + sc.args
		}
		fmt.Fprintf(w, "\n  %s\n      %s\n", synopsis, sc.summary)
		fs.SetOutput(w)
		fs.PrintDefaults()
	}
}

func main() {
	if len(os.Args) < 2 {
		usage(os.Stderr)
		os.Exit(2)
	}
	name, args := os.Args[1], os.Args[2:]
	if name == "-h" || name == "--help" || name == "help" {
		usage(os.Stdout)
		return
	}
	var sc *subcommand
	for i := range subcommands {
		if subcommands[i].name == name {
			sc = &subcommands[i]
		}
	}
	if sc == nil {
		fmt.Fprintf(os.Stderr, "unknown command %q\n", name)
		usage(os.Stderr)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fs := flag.NewFlagSet(sc.name, flag.ExitOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: localcluster %s %s[flags]\n", sc.name, strings.TrimSpace(sc.args+" "))
		fs.PrintDefaults()
	}
	run := sc.setup(fs)
	var positional []string
	if sc.args != "" && len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		positional, args = args[:1], args[1:]
	}
	_ = fs.Parse(args) // ExitOnError
	if err := run(ctx, append(positional, fs.Args()...)); err != nil {
		fmt.Fprintf(os.Stderr, "localcluster %s: %v\n", sc.name, err)
		os.Exit(1)
	}
}

// versionFlag registers --version: the Kubernetes release, by default the
// one $GPUTOPO_K8S_VERSION names, else the newest.
func versionFlag(fs *flag.FlagSet) *string {
	return fs.String("version", os.Getenv(cluster.VersionEnv),
		"Kubernetes release, e.g. v1.36.3 or 1.36 (env "+cluster.VersionEnv+"; default the newest, "+cluster.KubernetesVersion+"; localcluster versions lists them)")
}

// binDirFor is --out or --bin-dir when given, else $GPUTOPO_K8S_BIN, else
// the cache directory of the release --version names.
func binDirFor(dir, version string) (string, error) {
	if dir != "" {
		return dir, nil
	}
	if d := os.Getenv("GPUTOPO_K8S_BIN"); d != "" {
		return d, nil
	}
	rel := cluster.Releases[0]
	if version != "" {
		var err error
		if rel, err = cluster.LookupRelease(version); err != nil {
			return "", err
		}
	}
	return cluster.DefaultBinDirFor(rel.Version), nil
}

func setupBuild(fs *flag.FlagSet) func(context.Context, []string) error {
	out := fs.String("out", "", "directory for the Kubernetes binaries (env GPUTOPO_K8S_BIN; default ~/.cache/gputopo/k8s-VERSION/bin)")
	version := versionFlag(fs)
	containerdOut := fs.String("containerd-out", cluster.DefaultContainerdBinDir(), "directory for containerd, its runc shim and ctr (env GPUTOPO_CONTAINERD_BIN)")
	force := fs.Bool("force", false, "rebuild binaries that are current")
	return func(ctx context.Context, _ []string) error {
		rel := cluster.Releases[0]
		if *version != "" {
			var err error
			if rel, err = cluster.LookupRelease(*version); err != nil {
				return err
			}
		}
		dir, err := binDirFor(*out, rel.Version)
		if err != nil {
			return err
		}
		return cluster.Build(ctx, cluster.BuildOptions{Version: rel.Version, OutDir: dir, ContainerdOutDir: *containerdOut, Force: *force})
	}
}

func setupBuildPeers(fs *flag.FlagSet) func(context.Context, []string) error {
	out := fs.String("out", cluster.DefaultPeersBinDir(), "directory for the peers (env GPUTOPO_PEERS_BIN)")
	peers := fs.String("peers", "", "comma-separated peers to build (jobset, lws, kueue); empty: all")
	force := fs.Bool("force", false, "rebuild binaries that are current")
	return func(ctx context.Context, _ []string) error {
		list, err := cluster.ParsePeers(*peers)
		if err != nil {
			return err
		}
		return cluster.BuildPeers(ctx, cluster.BuildOptions{PeersOutDir: *out, Force: *force}, list...)
	}
}

func setupUp(fs *flag.FlagSet) func(context.Context, []string) error {
	topology := fs.String("topology", "", "topology file (YAML); required")
	dir := fs.String("dir", "", "cluster directory; required")
	pluginBin := fs.String("plugin-bin", "", "gputopo kubelet plugin binary; none started if empty")
	binDir := fs.String("bin-dir", "", "Kubernetes binaries (env GPUTOPO_K8S_BIN; default those of --version)")
	version := versionFlag(fs)
	controllerBin := fs.String("controller-bin", "", "gputopo controller binary; none started if empty")
	var manifests, noPlugin, images stringList
	fs.Var(&manifests, "manifest", "file or directory applied before the controller starts (repeatable)")
	fs.Var(&noPlugin, "no-plugin", "real node on which no plugin is started: a DaemonSet runs it there (repeatable)")
	fs.Var(&images, "image", "OCI image layout tarball imported into every containerd node, e.g. from hack/build-image-oci.sh (repeatable)")
	foreground := fs.Bool("foreground", false, "supervise in this process instead of daemonizing")
	timeout := fs.Duration("timeout", 5*time.Minute, "how long to wait for the cluster to be ready")
	return func(ctx context.Context, _ []string) error {
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
		for i, m := range images {
			if images[i], err = filepath.Abs(m); err != nil {
				return fmt.Errorf("resolve --image: %w", err)
			}
		}
		bins, err := binDirFor(*binDir, *version)
		if err != nil {
			return err
		}
		cfg := cluster.Config{Dir: absDir, BinDir: bins, Nodes: nodes, PluginBin: *pluginBin, Timeout: *timeout,
			ControllerBin: *controllerBin, Manifests: manifests, NoPluginNodes: noPlugin, Images: images}
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

func setupDown(fs *flag.FlagSet) func(context.Context, []string) error {
	dir := fs.String("dir", "", "cluster directory; required")
	return func(context.Context, []string) error {
		if *dir == "" {
			return errors.New("--dir is required")
		}
		return cluster.Down(*dir)
	}
}

func setupBinDir(fs *flag.FlagSet) func(context.Context, []string) error {
	version := versionFlag(fs)
	return func(context.Context, []string) error {
		dir, err := binDirFor("", *version)
		if err != nil {
			return err
		}
		_, err = fmt.Println(dir)
		return err
	}
}

func setupVersions(*flag.FlagSet) func(context.Context, []string) error {
	return func(context.Context, []string) error {
		for _, r := range cluster.Releases {
			if _, err := fmt.Println(r.Version); err != nil {
				return err
			}
		}
		return nil
	}
}

func setupFakeCRI(fs *flag.FlagSet) func(context.Context, []string) error {
	socket := fs.String("socket", "", "unix socket to serve CRI on; required")
	record := fs.String("record", "", "file to append CreateContainer records to (JSON lines); required")
	return func(ctx context.Context, _ []string) error {
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
}

func setupPlugin(fs *flag.FlagSet) func(context.Context, []string) error {
	dir := fs.String("dir", "", "cluster directory; required")
	node := fs.String("node", "", "real node whose plugin to drive; required")
	return func(_ context.Context, args []string) error {
		actions := map[string]func(*cluster.Cluster, string) error{
			"start": (*cluster.Cluster).StartPlugin, "stop": (*cluster.Cluster).StopPlugin,
			"kill": (*cluster.Cluster).KillPlugin, "restart": (*cluster.Cluster).RestartPlugin,
		}
		if len(args) != 1 || actions[args[0]] == nil {
			return fmt.Errorf("want one action: start, stop, kill or restart, got %q", args)
		}
		if *dir == "" || *node == "" {
			return errors.New("--dir and --node are required")
		}
		c, err := cluster.Attach(*dir)
		if err != nil {
			return err
		}
		return actions[args[0]](c, *node)
	}
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }
