package cli

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
	"github.com/gputopo/gputopo/pkg/labelmapping"
	"github.com/gputopo/gputopo/pkg/topology"
)

// Errors a person acts on differently.
var (
	// ErrNoCluster: the API server cannot be reached.
	ErrNoCluster = errors.New("cannot reach the Kubernetes API server")
	// ErrNotInstalled: no gputopo kubelet plugin publishes GPUs.
	ErrNotInstalled = errors.New("no node publishes gputopo GPUs (ResourceSlices of driver " + topology.DriverName +
		"): install gputopo (helm install gputopo deployments/helm/gputopo), or wait for its kubelet plugins to start")
	// ErrNotFound: no Job or group of that name.
	ErrNotFound = errors.New("not found")
	// ErrAmbiguous: a name found in several namespaces.
	ErrAmbiguous = errors.New("found in several namespaces")
)

// Topology is what `gputopo topology` shows.
type Topology struct {
	TypeMeta
	LabelMapping MappingView `json:"labelMapping"`
	GPUs         int         `json:"gpus"`
	FreeGPUs     int         `json:"freeGPUs"`
	Nodes        []NodeView  `json:"nodes"`
	// Waiting are the groups gputopo's gate still holds, oldest first.
	Waiting []WaitingGroup `json:"waiting,omitempty"`
}

// MappingView is the label mapping used and where it came from.
type MappingView struct {
	// Source is NAMESPACE/NAME of the ConfigMap, or "built-in defaults".
	Source string `json:"source"`
	topology.LabelMapping
}

// FetchTopology reads the cluster's gputopo GPUs, placed in the tree by
// the label mapping that the controller and the plugins read (or the one
// mappingRef names).
func FetchTopology(ctx context.Context, c kubernetes.Interface, mappingRef string) (*Topology, error) {
	mapping, source, err := labelmapping.Find(ctx, c, mappingRef)
	if err != nil {
		return nil, apiError(err)
	}
	nodes, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, apiError(fmt.Errorf("list nodes: %w", err))
	}
	rs, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: resourceapi.ResourceSliceSelectorDriver + "=" + topology.DriverName})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("the cluster does not serve resource.k8s.io/v1 ResourceSlices: gputopo needs Kubernetes 1.34 or later with dynamic resource allocation: %w", err)
	}
	if err != nil {
		return nil, apiError(fmt.Errorf("list ResourceSlices: %w", err))
	}
	if !slices.ContainsFunc(rs.Items, func(s resourceapi.ResourceSlice) bool { return s.Spec.Driver == topology.DriverName }) {
		return nil, ErrNotInstalled
	}
	claims, err := c.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, apiError(fmt.Errorf("list ResourceClaims: %w", err))
	}
	// Pods only name the Job that holds a GPU; without them the pod is named.
	var pods []v1.Pod
	if list, err := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); err == nil {
		pods = list.Items
	} else if !apierrors.IsForbidden(err) {
		return nil, apiError(fmt.Errorf("list pods: %w", err))
	}
	t := &Topology{LabelMapping: MappingView{Source: source, LabelMapping: mapping}}
	t.Nodes = BuildViews(nodes.Items, rs.Items, claims.Items, pods, mapping)
	t.Waiting = BuildWaiting(pods, time.Now())
	MarkReserved(t.Nodes, t.Waiting)
	for _, n := range t.Nodes {
		t.GPUs += len(n.GPUs)
		t.FreeGPUs += n.Free()
	}
	return t, nil
}

// FetchExplanation gathers the pods of t in namespace ns (the pods of a
// Job, of a JobSet, of a gputopo.dev/group, or one pod), their claims and
// the controller's events about them. With allNamespaces it finds the
// namespace first.
func FetchExplanation(ctx context.Context, c kubernetes.Interface, ns string, allNamespaces bool, t Target) (*Explanation, error) {
	if allNamespaces {
		var err error
		if ns, err = findNamespace(ctx, c, t); err != nil {
			return nil, err
		}
	}
	kind, pods, err := targetPods(ctx, c, ns, t)
	if err != nil {
		return nil, err
	}
	claims, err := c.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, apiError(fmt.Errorf("list ResourceClaims in %s: %w", ns, err))
	}
	evs, err := c.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, apiError(fmt.Errorf("list events in %s: %w", ns, err))
	}
	subjects := map[string]bool{t.Name: true}
	for _, p := range pods {
		subjects[p.Name] = true
	}
	var mine []v1.Event
	for _, e := range evs.Items {
		if subjects[e.InvolvedObject.Name] {
			mine = append(mine, e)
		}
	}
	var cs *ClusterState
	if slices.ContainsFunc(pods, func(p v1.Pod) bool { return p.Spec.NodeName == "" }) {
		if cs, err = fetchClusterState(ctx, c, ns); err != nil {
			return nil, err
		}
	}
	e := BuildExplanationIn(ctx, ns+"/"+t.Name, pods, claims.Items, mine, cs)
	e.GroupKind = kind
	return &e, nil
}

// fetchClusterState reads what explain needs to say why a pod in ns
// waits. Without permission to read it, explain says less: nil, no error.
func fetchClusterState(ctx context.Context, c kubernetes.Interface, ns string) (*ClusterState, error) {
	cs := &ClusterState{}
	forbidden := false
	list := func(what string, do func() error) error {
		err := do()
		switch {
		case apierrors.IsForbidden(err):
			forbidden = true
			return nil
		case err != nil:
			return apiError(fmt.Errorf("list %s: %w", what, err))
		}
		return nil
	}
	steps := []struct {
		what string
		do   func() error
	}{
		{"nodes", func() error {
			l, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
			if err == nil {
				cs.Nodes = l.Items
			}
			return err
		}},
		{"ResourceSlices", func() error {
			l, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
			if err == nil {
				cs.Slices = l.Items
			}
			return err
		}},
		{"ResourceClaims in every namespace", func() error {
			l, err := c.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
			if err == nil {
				cs.Claims = l.Items
			}
			return err
		}},
		{"DeviceClasses", func() error {
			l, err := c.ResourceV1().DeviceClasses().List(ctx, metav1.ListOptions{})
			if err == nil {
				cs.Classes = l.Items
			}
			return err
		}},
		{"ResourceClaimTemplates in " + ns, func() error {
			l, err := c.ResourceV1().ResourceClaimTemplates(ns).List(ctx, metav1.ListOptions{})
			if err == nil {
				cs.Templates = l.Items
			}
			return err
		}},
	}
	for _, st := range steps {
		if err := list(st.what, st.do); err != nil {
			return nil, err
		}
	}
	if forbidden {
		return nil, nil
	}
	// DeviceTaintRules are optional: a cluster may not serve them.
	if l, err := c.ResourceV1().DeviceTaintRules().List(ctx, metav1.ListOptions{}); err == nil {
		cs.TaintRules = l.Items
	}
	return cs, nil
}

// lookHint is what to check when a target is not found.
const lookHint = "check the name and -n/--namespace, or search every namespace with -A"

// targetPods lists the pods of t in ns and says what t is: for a plain
// name, the Job's pods, else the group's, else the pod of that name.
func targetPods(ctx context.Context, c kubernetes.Interface, ns string, t Target) (placement.GroupKind, []v1.Pod, error) {
	switch t.Kind {
	case placement.GroupKindJob:
		pods, err := labelledPods(ctx, c, ns, batchv1.JobNameLabel, t.Name)
		if err != nil || len(pods) > 0 {
			return t.Kind, pods, err
		}
		ok, err := jobExists(ctx, c, ns, t.Name)
		if err == nil && !ok {
			err = fmt.Errorf("Job %s/%s %w: %s", ns, t.Name, ErrNotFound, lookHint)
		}
		return t.Kind, nil, err
	case placement.GroupKindJobSet:
		pods, err := labelledPods(ctx, c, ns, LabelJobSetName, t.Name)
		if err != nil || len(pods) > 0 {
			return t.Kind, pods, err
		}
		jobs, err := c.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{LabelSelector: LabelJobSetName + "=" + t.Name})
		if err != nil {
			return "", nil, apiError(fmt.Errorf("list Jobs of JobSet %s/%s: %w", ns, t.Name, err))
		}
		if len(jobs.Items) == 0 {
			return "", nil, fmt.Errorf("JobSet %s/%s %w: no Job or pod carries %s=%s; %s", ns, t.Name, ErrNotFound, LabelJobSetName, t.Name, lookHint)
		}
		return t.Kind, nil, nil
	case placement.GroupKindGroup:
		pods, err := groupPods(ctx, c, ns, t.Name)
		if err == nil && len(pods) == 0 {
			err = fmt.Errorf("group %s/%s %w: no pod in namespace %s carries %s=%s; %s", ns, t.Name, ErrNotFound, ns, placement.AnnotationGroup, t.Name, lookHint)
		}
		return t.Kind, pods, err
	case placement.GroupKindPod:
		p, err := c.CoreV1().Pods(ns).Get(ctx, t.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return "", nil, fmt.Errorf("pod %s/%s %w: %s", ns, t.Name, ErrNotFound, lookHint)
		}
		if err != nil {
			return "", nil, apiError(fmt.Errorf("get pod %s/%s: %w", ns, t.Name, err))
		}
		return t.Kind, []v1.Pod{*p}, nil
	}
	for _, kind := range []placement.GroupKind{placement.GroupKindJob, placement.GroupKindGroup} {
		var pods []v1.Pod
		var err error
		if kind == placement.GroupKindJob {
			pods, err = labelledPods(ctx, c, ns, batchv1.JobNameLabel, t.Name)
		} else {
			pods, err = groupPods(ctx, c, ns, t.Name)
		}
		if err != nil || len(pods) > 0 {
			return kind, pods, err
		}
	}
	if ok, err := jobExists(ctx, c, ns, t.Name); err != nil || ok {
		return placement.GroupKindJob, nil, err
	}
	p, err := c.CoreV1().Pods(ns).Get(ctx, t.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", nil, fmt.Errorf("Job %s/%s %w, no pod in namespace %s carries %s=%s, and there is no pod %s: %s",
			ns, t.Name, ErrNotFound, ns, placement.AnnotationGroup, t.Name, t.Name, lookHint)
	}
	if err != nil {
		return "", nil, apiError(fmt.Errorf("get pod %s/%s: %w", ns, t.Name, err))
	}
	return placement.GroupKindPod, []v1.Pod{*p}, nil
}

func jobExists(ctx context.Context, c kubernetes.Interface, ns, name string) (bool, error) {
	_, err := c.BatchV1().Jobs(ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, apiError(fmt.Errorf("get Job %s/%s: %w", ns, name, err))
	}
	return true, nil
}

// labelledPods lists the pods in ns with label key=value.
func labelledPods(ctx context.Context, c kubernetes.Interface, ns, key, value string) ([]v1.Pod, error) {
	list, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: key + "=" + value})
	if err != nil {
		return nil, apiError(fmt.Errorf("list pods in %s with %s=%s: %w", ns, key, value, err))
	}
	return list.Items, nil
}

// groupPods lists the pods in ns that name the group in
// gputopo.dev/group.
func groupPods(ctx context.Context, c kubernetes.Interface, ns, name string) ([]v1.Pod, error) {
	all, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, apiError(fmt.Errorf("list pods in %s: %w", ns, err))
	}
	var out []v1.Pod
	for _, p := range all.Items {
		if p.Annotations[placement.AnnotationGroup] == name {
			out = append(out, p)
		}
	}
	return out, nil
}

// findNamespace finds the one namespace that holds t: for a plain name, a
// Job of that name, else a group, else a pod.
func findNamespace(ctx context.Context, c kubernetes.Interface, t Target) (string, error) {
	found := map[string]bool{}
	kinds := []placement.GroupKind{t.Kind}
	if t.Kind == "" {
		kinds = []placement.GroupKind{placement.GroupKindJob, placement.GroupKindGroup, placement.GroupKindPod}
	}
	var pods []v1.Pod
	listPods := func() error {
		if pods != nil {
			return nil
		}
		list, err := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return apiError(fmt.Errorf("list pods in every namespace: %w", err))
		}
		pods = list.Items
		return nil
	}
	for _, kind := range kinds {
		switch kind {
		case placement.GroupKindJob:
			jobs, err := c.BatchV1().Jobs("").List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", t.Name).String()})
			if err != nil {
				return "", apiError(fmt.Errorf("list Jobs in every namespace: %w", err))
			}
			for _, j := range jobs.Items {
				if j.Name == t.Name {
					found[j.Namespace] = true
				}
			}
		case placement.GroupKindJobSet:
			jobs, err := c.BatchV1().Jobs("").List(ctx, metav1.ListOptions{LabelSelector: LabelJobSetName + "=" + t.Name})
			if err != nil {
				return "", apiError(fmt.Errorf("list Jobs of JobSet %s in every namespace: %w", t.Name, err))
			}
			for _, j := range jobs.Items {
				if j.Labels[LabelJobSetName] == t.Name {
					found[j.Namespace] = true
				}
			}
			if err := listPods(); err != nil {
				return "", err
			}
			for _, p := range pods {
				if p.Labels[LabelJobSetName] == t.Name {
					found[p.Namespace] = true
				}
			}
		default:
			if err := listPods(); err != nil {
				return "", err
			}
			for _, p := range pods {
				if kind == placement.GroupKindGroup && p.Annotations[placement.AnnotationGroup] == t.Name ||
					kind == placement.GroupKindPod && p.Name == t.Name {
					found[p.Namespace] = true
				}
			}
		}
		if len(found) > 0 {
			break
		}
	}
	nss := slices.Sorted(maps.Keys(found))
	switch len(nss) {
	case 0:
		return "", fmt.Errorf("%s %w in any namespace", describeTarget(t), ErrNotFound)
	case 1:
		return nss[0], nil
	}
	return "", fmt.Errorf("%s %w (%s): name one with -n", t, ErrAmbiguous, strings.Join(nss, ", "))
}

// describeTarget says what was looked for.
func describeTarget(t Target) string {
	switch t.Kind {
	case placement.GroupKindJob:
		return "Job " + t.Name
	case placement.GroupKindJobSet:
		return "JobSet " + t.Name + " (a Job or pod with " + LabelJobSetName + "=" + t.Name + ")"
	case placement.GroupKindGroup:
		return "group " + t.Name + " (a pod with " + placement.AnnotationGroup + "=" + t.Name + ")"
	case placement.GroupKindPod:
		return "pod " + t.Name
	}
	return fmt.Sprintf("%s (a Job, a pod with %s=%s, or a pod of that name)", t.Name, placement.AnnotationGroup, t.Name)
}

// apiError turns the error of an unreachable API server into one that
// says what to check.
func apiError(err error) error {
	var uerr *url.Error
	if errors.As(err, &uerr) {
		host := uerr.URL
		if u, perr := url.Parse(uerr.URL); perr == nil {
			host = u.Host
		}
		return fmt.Errorf("%w at %s: is the cluster running, and do --kubeconfig and --context point at it? (%w)", ErrNoCluster, host, uerr.Err)
	}
	var nerr net.Error
	if errors.As(err, &nerr) {
		return fmt.Errorf("%w: is the cluster running, and do --kubeconfig and --context point at it? (%w)", ErrNoCluster, err)
	}
	return err
}
