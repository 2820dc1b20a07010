package cluster

import (
	"context"
	"fmt"
	"os"
	"time"
)

// StartPluginWith starts a node's plugin as StartPlugin does, with extra
// appended to its command line for this start only (a later StartPlugin or
// RestartPlugin starts it with the cluster's arguments again). It returns
// once the kubelet has registered the plugin.
func (c *Cluster) StartPluginWith(node string, extra ...string) error {
	if _, err := c.realNode(node); err != nil {
		return err
	}
	if !c.runsPlugin(node) {
		return fmt.Errorf("start plugin of %s: the cluster runs no plugin there (no plugin binary, or NoPluginNodes)", node)
	}
	if p := c.procByName("plugin-" + node); p != nil && !p.exited() {
		return fmt.Errorf("start plugin of %s: already running as pid %d", node, p.pid)
	}
	var logged int64
	if fi, err := os.Stat(c.logPath("kubelet-" + node)); err == nil {
		logged = fi.Size()
	}
	argv := append(append([]string{c.cfg.PluginBin}, c.pluginArgs(c.nodes[node].spec)...), extra...)
	if err := c.launchOpts("plugin-"+node, procOpts{workDir: c.NodeDir(node)}, argv...); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.waitPluginSockets(ctx, node); err != nil {
		return fmt.Errorf("start plugin of %s: %w", node, err)
	}
	return c.waitPluginRegistered(ctx, node, logged)
}
