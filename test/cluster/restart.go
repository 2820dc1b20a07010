package cluster

import (
	"context"
	"fmt"
	"os"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Restarting what the cluster runs, for fault tests: the control plane's
// processes and the kubelets, each with the command line it started with.
// Only a Cluster from Start can restart a process; one from Attach does not
// know the command lines.

// RestartControlPlane stops kube-apiserver, kube-scheduler or
// kube-controller-manager (SIGTERM, SIGKILL after a timeout), starts it
// again with the same command line and returns once it is healthy again.
func (c *Cluster) RestartControlPlane(ctx context.Context, name string) error {
	var healthy func() error
	switch name {
	case "kube-apiserver":
		healthy = func() error { return c.waitReadyz(ctx, 90*time.Second) }
	case "kube-scheduler", "kube-controller-manager":
		port := c.ports.Scheduler
		if name == "kube-controller-manager" {
			port = c.ports.ControllerManager
		}
		healthy = func() error {
			return c.waitHTTP(ctx, name, fmt.Sprintf("https://127.0.0.1:%d/healthz", port), 60*time.Second)
		}
	default:
		return fmt.Errorf("restart %s: only kube-apiserver, kube-scheduler and kube-controller-manager restart", name)
	}
	if err := c.stopForRestart(name); err != nil {
		return err
	}
	if err := c.relaunch(name); err != nil {
		return err
	}
	return healthy()
}

// StopKubelet stops a real node's kubelet (SIGTERM, SIGKILL after a
// timeout). Its plugin and fake CRI keep running. The Node stays Ready
// until something marks it otherwise: the harness's node-monitor grace
// period, which keeps kubelet-less fake nodes Ready, keeps it so too.
func (c *Cluster) StopKubelet(node string) error {
	if _, err := c.realNode(node); err != nil {
		return err
	}
	return c.stopForRestart("kubelet-" + node)
}

// StartKubelet starts a stopped kubelet again with its command line and
// returns once the node is Ready and untainted and, while the node's
// plugin runs, the kubelet has registered it again. A kubelet whose Node
// object was deleted registers a new one (whose ResourceSlices the plugin
// publishes only once it is restarted: the old ones were owned by the
// deleted Node).
func (c *Cluster) StartKubelet(ctx context.Context, node string) error {
	if _, err := c.realNode(node); err != nil {
		return err
	}
	name := "kubelet-" + node
	var logged int64
	if fi, err := os.Stat(c.logPath(name)); err == nil {
		logged = fi.Size()
	}
	if err := c.relaunch(name); err != nil {
		return err
	}
	err := c.poll(ctx, 2*time.Minute, func() (bool, error) {
		n, err := c.client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		return err == nil && nodeUsable(n), nil
	}, name)
	if err != nil {
		return fmt.Errorf("wait for node %s to be Ready after its kubelet started: %w", node, err)
	}
	if p := c.procByName("plugin-" + node); p != nil && !p.exited() {
		return c.waitPluginRegistered(ctx, node, logged)
	}
	return nil
}

// stopForRestart stops a running process that relaunch can start again.
func (c *Cluster) stopForRestart(name string) error {
	p := c.procByName(name)
	if p == nil || p.exited() {
		return fmt.Errorf("stop %s: %w", name, ErrNotRunning)
	}
	if p.argv == nil {
		return fmt.Errorf("stop %s: found through its pid file, so its command line is unknown and it could not be started again", name)
	}
	p.stop(stopTimeout)
	return nil
}

// relaunch starts a process of this cluster that has ended again, with the
// command line and options it was first started with.
func (c *Cluster) relaunch(name string) error {
	c.mu.Lock()
	p := c.procs[name]
	c.mu.Unlock()
	switch {
	case p == nil || p.argv == nil:
		return fmt.Errorf("start %s again: this cluster did not start it", name)
	case !p.exited():
		return fmt.Errorf("start %s again: already running as pid %d", name, p.pid)
	}
	return c.launchOpts(name, p.opts, slices.Clone(p.argv)...)
}
