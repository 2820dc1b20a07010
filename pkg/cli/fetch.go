package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"

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
	LabelMapping MappingView `json:"labelMapping"`
	GPUs         int         `json:"gpus"`
	FreeGPUs     int         `json:"freeGPUs"`
	Nodes        []NodeView  `json:"nodes"`
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
	for _, n := range t.Nodes {
		t.GPUs += len(n.GPUs)
		t.FreeGPUs += n.Free()
	}
	return t, nil
}

// FetchExplanation gathers the pods of the Job name in namespace ns, or of
// the gputopo.dev/group of that name, their claims and the controller's
// events about them. With allNamespaces it finds the namespace first.
func FetchExplanation(ctx context.Context, c kubernetes.Interface, ns string, allNamespaces bool, name string) (*Explanation, error) {
	if allNamespaces {
		var err error
		if ns, err = findNamespace(ctx, c, name); err != nil {
			return nil, err
		}
	}
	pods, err := groupPods(ctx, c, ns, name)
	if err != nil {
		return nil, err
	}
	if len(pods) == 0 {
		if _, err := c.BatchV1().Jobs(ns).Get(ctx, name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("Job %s/%s %w, and no pod in namespace %s carries %s=%s: check the name and -n/--namespace, or search every namespace with -A",
				ns, name, ErrNotFound, ns, placement.AnnotationGroup, name)
		} else if err != nil {
			return nil, apiError(fmt.Errorf("get Job %s/%s: %w", ns, name, err))
		}
	}
	claims, err := c.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, apiError(fmt.Errorf("list ResourceClaims in %s: %w", ns, err))
	}
	evs, err := c.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, apiError(fmt.Errorf("list events in %s: %w", ns, err))
	}
	subjects := map[string]bool{name: true}
	for _, p := range pods {
		subjects[p.Name] = true
	}
	var mine []v1.Event
	for _, e := range evs.Items {
		if subjects[e.InvolvedObject.Name] {
			mine = append(mine, e)
		}
	}
	e := BuildExplanation(ns+"/"+name, pods, claims.Items, mine)
	return &e, nil
}

// groupPods lists the pods of the Job name, else of the group name.
func groupPods(ctx context.Context, c kubernetes.Interface, ns, name string) ([]v1.Pod, error) {
	list, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=" + name})
	if err != nil {
		return nil, apiError(fmt.Errorf("list pods of Job %s/%s: %w", ns, name, err))
	}
	if len(list.Items) > 0 {
		return list.Items, nil
	}
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

// findNamespace finds the one namespace with a Job, or else a group, of
// that name.
func findNamespace(ctx context.Context, c kubernetes.Interface, name string) (string, error) {
	jobs, err := c.BatchV1().Jobs("").List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	if err != nil {
		return "", apiError(fmt.Errorf("list Jobs in every namespace: %w", err))
	}
	found := map[string]bool{}
	for _, j := range jobs.Items {
		if j.Name == name {
			found[j.Namespace] = true
		}
	}
	if len(found) == 0 {
		pods, err := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return "", apiError(fmt.Errorf("list pods in every namespace: %w", err))
		}
		for _, p := range pods.Items {
			if p.Annotations[placement.AnnotationGroup] == name {
				found[p.Namespace] = true
			}
		}
	}
	var nss []string
	for ns := range found {
		nss = append(nss, ns)
	}
	slices.Sort(nss)
	switch len(nss) {
	case 0:
		return "", fmt.Errorf("no Job %s and no pod with %s=%s in any namespace: %w", name, placement.AnnotationGroup, name, ErrNotFound)
	case 1:
		return nss[0], nil
	}
	return "", fmt.Errorf("%s %w (%s): name one with -n", name, ErrAmbiguous, strings.Join(nss, ", "))
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
