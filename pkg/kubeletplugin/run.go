package kubeletplugin

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/gputopo/gputopo/pkg/topology"
)

// Run serves the plugin until ctx is done or a fatal error occurs.
func Run(ctx context.Context, cfg Config) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	logger := klog.FromContext(ctx)

	// Probes get NOT_SERVING, not a refused connection, while the plugin
	// waits for its node and discovers.
	probes := &probeServer{}
	stopProbes, err := serveProbes(ctx, cfg.HealthProbeAddress, probes)
	if err != nil {
		return err
	}
	defer stopProbes()

	node, err := getNode(ctx, cfg)
	if err != nil {
		return err
	}
	d, err := New(ctx, cfg, node.Labels, cancel)
	if err != nil {
		return err
	}
	defer func() { _ = cfg.Backend.Close() }()

	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(topology.DriverName),
		kubeletplugin.KubeClient(cfg.KubeClient),
		kubeletplugin.NodeName(cfg.NodeName),
		kubeletplugin.NodeUID(node.UID),
		kubeletplugin.RegistrarDirectoryPath(cfg.RegistrarDir),
		kubeletplugin.PluginDataDirectoryPath(cfg.PluginDir),
		kubeletplugin.PluginSocket(DRASocket),
	)
	if err != nil {
		return fmt.Errorf("start kubelet plugin helper: %w", err)
	}
	defer helper.Stop()
	probes.setHelper(helper.RegistrationStatus, draSocketPath(cfg.PluginDir))
	if err := d.setPublisher(ctx, helper); err != nil {
		return err
	}

	// Watch only this node, for label changes that move it in the tree,
	// and the label mapping, which can move every node.
	factory := informers.NewSharedInformerFactoryWithOptions(cfg.KubeClient, 10*time.Minute,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", cfg.NodeName).String()
		}))
	onNode := func(obj any) {
		if n, ok := obj.(*v1.Node); ok {
			if err := d.SetLabels(ctx, n.Labels); err != nil {
				d.HandleError(ctx, fmt.Errorf("%w: %w", kubeletplugin.ErrRecoverable, err), "republish after node label change")
			}
		}
	}
	if _, err := factory.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    onNode,
		UpdateFunc: func(_, obj any) { onNode(obj) },
	}); err != nil {
		return fmt.Errorf("watch node %s: %w", cfg.NodeName, err)
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if cfg.LabelMapping != nil {
		cfg.LabelMapping.OnChange(func(m topology.LabelMapping) {
			if err := d.SetLabelMapping(ctx, m); err != nil {
				d.HandleError(ctx, fmt.Errorf("%w: %w", kubeletplugin.ErrRecoverable, err), "republish after label mapping change")
			}
		})
	}

	go d.watchHealth(ctx)
	go d.refreshLoop(ctx)
	logger.Info("gputopo kubelet plugin running", "node", cfg.NodeName, "driver", topology.DriverName)
	<-ctx.Done()
	if cause := context.Cause(ctx); cause != nil && cause != context.Canceled {
		return cause
	}
	return nil
}

// getNode waits for the node object, which a kubelet that starts at the
// same time as the plugin may not have registered yet.
func getNode(ctx context.Context, cfg Config) (*v1.Node, error) {
	var node *v1.Node
	err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := cfg.KubeClient.CoreV1().Nodes().Get(ctx, cfg.NodeName, metav1.GetOptions{})
		if err != nil {
			klog.FromContext(ctx).V(2).Info("Waiting for node object", "node", cfg.NodeName, "err", err)
			return false, nil
		}
		node = n
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("get node %s (is --node-name right, and may the plugin read nodes?): %w", cfg.NodeName, err)
	}
	return node, nil
}
