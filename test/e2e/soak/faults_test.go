package soak

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	cluster "github.com/gputopo/gputopo/test/cluster"
)

// What the soak does to the cluster.
type faultKind string

const (
	// The Node object is deleted (a fake node's slices stay; a real
	// node's go with it), then created again: a fake node by the harness,
	// a real one by its restarted kubelet, with its plugin restarted to
	// publish again.
	faultNodeDeleted faultKind = "node-deleted"
	// A real node's kubelet stops and the node turns NotReady; later the
	// kubelet starts again.
	faultNodeNotReady faultKind = "node-notready"
	// A real node's kubelet plugin restarts: gracefully or killed.
	faultPluginRestart faultKind = "plugin-restart"
	// The gputopo controller restarts: stopped or killed.
	faultControllerRestart faultKind = "controller-restart"
	faultSchedulerRestart  faultKind = "kube-scheduler-restart"
	faultAPIServerRestart  faultKind = "kube-apiserver-restart"
)

var faultKinds = []faultKind{faultNodeDeleted, faultNodeNotReady, faultPluginRestart, faultControllerRestart, faultSchedulerRestart, faultAPIServerRestart}

// fault is one planned fault: its kind, its target node if it has one,
// how long it holds before it is undone, and how it is done.
type fault struct {
	kind faultKind
	node string
	real bool
	hold time.Duration
	kill bool // SIGKILL rather than a graceful stop
}

func (f fault) String() string {
	s := string(f.kind)
	if f.node != "" {
		kind := "fake"
		if f.real {
			kind = "real"
		}
		s += fmt.Sprintf(" of %s (%s)", f.node, kind)
	}
	if f.kill {
		s += ", killed"
	}
	if f.hold > 0 {
		s += fmt.Sprintf(", held %s", f.hold)
	}
	return s
}

// planFault draws the next fault from the fault source.
func planFault(r *rand.Rand, nodes []cluster.NodeSpec) fault {
	f := fault{kind: faultKinds[r.IntN(len(faultKinds))]}
	var real []cluster.NodeSpec
	for _, n := range nodes {
		if n.Real {
			real = append(real, n)
		}
	}
	switch f.kind {
	case faultNodeDeleted:
		n := nodes[r.IntN(len(nodes))]
		f.node, f.real = n.Name, n.Real
		f.hold = time.Duration(15+r.IntN(46)) * time.Second
	case faultNodeNotReady:
		f.node, f.real = real[r.IntN(len(real))].Name, true
		f.hold = time.Duration(15+r.IntN(46)) * time.Second
	case faultPluginRestart:
		f.node, f.real = real[r.IntN(len(real))].Name, true
		f.kill = r.IntN(2) == 0
	case faultControllerRestart:
		f.kill = r.IntN(2) == 0
	}
	return f
}

// inject does the fault and returns what undoes it (nil when the fault is
// over once inject returns, as a restart is).
func inject(ctx context.Context, f fault) (undo func(context.Context) error, err error) {
	client := lc.Client()
	switch f.kind {
	case faultNodeDeleted:
		if err := client.CoreV1().Nodes().Delete(ctx, f.node, metav1.DeleteOptions{}); err != nil {
			return nil, fmt.Errorf("delete node %s: %w", f.node, err)
		}
		return func(ctx context.Context) error { return restoreNode(ctx, f) }, nil
	case faultNodeNotReady:
		if err := lc.StopKubelet(f.node); err != nil {
			return nil, err
		}
		undo = func(ctx context.Context) error { return lc.StartKubelet(ctx, f.node) }
		if err := markUnreachable(ctx, f.node); err != nil {
			return undo, err
		}
		return undo, nil
	case faultPluginRestart:
		if f.kill {
			if err := lc.KillPlugin(f.node); err != nil {
				return nil, err
			}
			return nil, lc.StartPlugin(f.node)
		}
		return nil, lc.RestartPlugin(f.node)
	case faultControllerRestart:
		controllerMu.Lock()
		defer controllerMu.Unlock()
		stop := lc.StopController
		if f.kill {
			stop = lc.KillController
		}
		if err := stop(); err != nil && !errors.Is(err, cluster.ErrNotRunning) {
			return nil, err
		}
		return nil, lc.StartController()
	case faultSchedulerRestart:
		return nil, lc.RestartControlPlane(ctx, "kube-scheduler")
	case faultAPIServerRestart:
		return nil, lc.RestartControlPlane(ctx, "kube-apiserver")
	}
	return nil, fmt.Errorf("unknown fault %q", f.kind)
}

// controllerMu keeps the controller-restart fault and superviseController
// from starting the controller at once.
var controllerMu sync.Mutex

// superviseController starts the controller again whenever it has ended
// on its own, as the kubelet restarts the pod of its Deployment, until ctx
// ends. The controller ends when it loses its leader Lease (the API server
// away for longer than the Lease's renew deadline, 10 s), and a controller
// started while the API server is still away ends at once; like the
// kubelet's crash-loop backoff, a start that fails is retried after a
// delay that doubles, from 1 s up to 10 s.
func superviseController(ctx context.Context, rec *recorder) {
	const first, most = time.Second, 10 * time.Second
	delay, next := first, time.Time{}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		controllerMu.Lock()
		if !lc.ControllerRunning() && !time.Now().Before(next) {
			err := lc.StartController()
			rec.mu.Lock()
			rec.controllerStarts++
			if err != nil {
				rec.controllerStartsFailed++
			}
			rec.mu.Unlock()
			if err != nil {
				rec.event("the controller has ended; starting it again failed (retry in %s): %v", delay, firstLine(err))
				next = time.Now().Add(delay)
				delay = min(2*delay, most)
			} else {
				rec.event("the controller had ended (see logs/controller.log); started it again, as its Deployment's pod would be")
				delay, next = first, time.Time{}
			}
		}
		controllerMu.Unlock()
	}
}

func firstLine(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	return s
}

// markUnreachable sets the node's Ready condition to Unknown, as the node
// lifecycle controller does once a kubelet has been silent for its grace
// period. The harness sets that period to ten years, so that kubelet-less
// fake nodes stay Ready; the lifecycle controller still taints a node
// whose condition is Unknown (unreachable, NoSchedule and NoExecute).
func markUnreachable(ctx context.Context, node string) error {
	now := metav1.Now()
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: corev1.ConditionUnknown, Reason: "NodeStatusUnknown",
		Message: "Kubelet stopped posting node status.", LastHeartbeatTime: now, LastTransitionTime: now,
	}}}})
	if err != nil {
		return err
	}
	_, err = lc.Client().CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	if err != nil {
		return fmt.Errorf("mark node %s NotReady: %w", node, err)
	}
	return nil
}

// restoreNode brings a deleted node back with its ResourceSlices.
func restoreNode(ctx context.Context, f fault) error {
	if !f.real {
		if err := lc.RestoreFakeNode(ctx, f.node); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("restore node %s: %w", f.node, err)
		}
		return nil
	}
	// The running kubelet does not register its Node again; a started one
	// does. The plugin's slices were owned by the deleted Node: a
	// restarted plugin publishes them for the new one.
	if err := lc.StopKubelet(f.node); err != nil {
		return err
	}
	if err := lc.StartKubelet(ctx, f.node); err != nil {
		return err
	}
	if err := lc.RestartPlugin(f.node); err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		sl, err := lc.Client().ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: resourcev1.ResourceSliceSelectorNodeName + "=" + f.node})
		return err == nil && len(sl.Items) > 0, nil
	})
}
