package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"time"
)

// controllerProc is the process name of the gputopo controller.
const controllerProc = "controller"

// StartController starts the gputopo controller against the cluster and
// waits until its metrics endpoint answers.
func (c *Cluster) StartController() error {
	if c.cfg.ControllerBin == "" {
		return fmt.Errorf("start controller: the cluster has no controller binary")
	}
	if p := c.procByName(controllerProc); p != nil && !p.exited() {
		return fmt.Errorf("start controller: already running as pid %d", p.pid)
	}
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	addr := "127.0.0.1:" + strconv.Itoa(ports[0])
	argv := append([]string{c.cfg.ControllerBin,
		"--kubeconfig=" + c.Kubeconfig(),
		"--metrics-address=" + addr,
		"--leader-election-namespace=kube-system",
		"--leader-election-identity=localcluster",
	}, c.cfg.ControllerArgs...)
	if err := c.launchOpts(controllerProc, procOpts{workDir: c.dir}, argv...); err != nil {
		return err
	}
	if err := os.WriteFile(c.controllerAddrFile(), []byte(addr), 0o600); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return c.waitHTTP(ctx, controllerProc, "http://"+addr+"/metrics", time.Minute)
}

// ControllerMetricsURL is where the running controller serves /metrics.
func (c *Cluster) ControllerMetricsURL() (string, error) {
	data, err := os.ReadFile(c.controllerAddrFile())
	if err != nil {
		return "", fmt.Errorf("controller address: %w", err)
	}
	return "http://" + string(data) + "/metrics", nil
}

func (c *Cluster) controllerAddrFile() string { return c.dir + "/run/controller.addr" }

// StopController stops the controller with SIGTERM.
func (c *Cluster) StopController() error {
	p := c.procByName(controllerProc)
	if p == nil || p.exited() {
		return fmt.Errorf("controller: %w", ErrNotRunning)
	}
	p.stop(stopTimeout)
	return nil
}

// KillController kills the controller with SIGKILL, as a crash would.
func (c *Cluster) KillController() error {
	p := c.procByName(controllerProc)
	if p == nil || p.exited() {
		return fmt.Errorf("controller: %w", ErrNotRunning)
	}
	p.kill(stopTimeout)
	return nil
}

// applyManifests server-side applies Config.Manifests with the cluster's
// kubectl, so admission policies are in force before anything else runs.
func (c *Cluster) applyManifests(ctx context.Context) error {
	for _, m := range c.cfg.Manifests {
		cmd := exec.CommandContext(ctx, c.bin("kubectl"), "--kubeconfig", c.Kubeconfig(), "apply", "--server-side", "-f", m)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("apply %s: %w: %s", m, err, out)
		}
	}
	if len(c.cfg.Manifests) > 0 {
		// Admission policies take effect asynchronously; give the
		// apiserver's policy informer a moment.
		time.Sleep(2 * time.Second)
	}
	return nil
}
