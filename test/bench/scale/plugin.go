package scale

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gputopo/gputopo/demo/specs"
)

// PluginResult is the kubelet plugin's footprint on one real node.
type PluginResult struct {
	Node, Profile string
	GPUs          int
	Pods          int
	// Idle is read after the plugin published its slices, Loaded once
	// every pod runs with its claim prepared.
	Idle, Loaded ProcStat
	Kubelet      ProcStat
}

// PluginMemory reads the plugin's memory on the environment's one real
// node, idle and then with pods pods of template running there.
func PluginMemory(ctx context.Context, env *Env, template string, pods int) (PluginResult, error) {
	var res PluginResult
	if len(env.Nodes) != 1 || !env.Nodes[0].Real {
		return res, fmt.Errorf("the plugin measurement needs a cluster of exactly one real node, got %d nodes", len(env.Nodes))
	}
	node := env.Nodes[0]
	res.Node, res.Profile, res.Pods = node.Name, node.Profile, pods
	slices, err := env.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return res, fmt.Errorf("list ResourceSlices: %w", err)
	}
	for _, s := range slices.Items {
		res.GPUs += len(s.Spec.Devices)
	}
	plugin := "plugin-" + node.Name
	if res.Idle, err = ClusterProc(env.Cluster.Dir(), plugin); err != nil {
		return res, err
	}
	t, err := specs.ClaimTemplate(template)
	if err != nil {
		return res, err
	}
	if err := env.CreateTemplates(ctx, []*resourcev1.ResourceClaimTemplate{t}); err != nil {
		return res, err
	}
	for i := range pods {
		pod := NewPod(fmt.Sprintf("plugin-%d", i), "plugin", template, "")
		if _, err := env.Client.CoreV1().Pods(Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return res, fmt.Errorf("create pod %s: %w", pod.Name, err)
		}
	}
	err = wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := env.Client.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: LabelWorkload + "=plugin"})
		if err != nil {
			return false, nil
		}
		running := 0
		for _, p := range l.Items {
			if p.Status.Phase == corev1.PodRunning {
				running++
			}
		}
		return running == pods, nil
	})
	if err != nil {
		return res, fmt.Errorf("wait for %d pods of %s to run on %s: %w (see %s)", pods, template, node.Name, err, env.Cluster.LogPath(plugin))
	}
	if res.Loaded, err = ClusterProc(env.Cluster.Dir(), plugin); err != nil {
		return res, err
	}
	res.Kubelet, err = ClusterProc(env.Cluster.Dir(), "kubelet-"+node.Name)
	return res, err
}
