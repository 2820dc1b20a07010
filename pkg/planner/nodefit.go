package planner

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	resourcehelper "k8s.io/component-helpers/resource"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"
)

// Node filters: before any device is considered, a pod may only go where
// kube-scheduler would let it, so a plan never names a node the pod cannot
// bind to. The checks are the scheduler's own (the component-helpers
// that its NodeAffinity, TaintToleration, NodeUnschedulable and
// NodeResourcesFit plugins call), plus readiness. Which nodes a pod may
// use is decided per node, never per node signature: nodes that share
// allocator answers can still differ in labels, taints and free cpu.

// PodFor turns a pod and its instantiated claims into the planner's Pod.
func PodFor(pod *v1.Pod, claims []*resourceapi.ResourceClaim) Pod {
	p := Pod{Name: pod.Name, Claims: claims, NodeSelector: pod.Spec.NodeSelector, Tolerations: pod.Spec.Tolerations, Requests: podRequests(pod),
		AntiAffinity: RequiredAntiAffinity(pod), Affinity: requiredAffinity(pod), Spread: requiredSpread(pod), HostPorts: RequiredHostPorts(pod), Members: []Member{{Namespace: pod.Namespace, Labels: pod.Labels}}}
	if pod.Spec.Affinity != nil {
		p.NodeAffinity = pod.Spec.Affinity.NodeAffinity
	}
	// Set even when the pod has none, so that a caller narrowing
	// NodeAffinity leaves what the spread constraints count as it is.
	p.OwnNodeAffinity = p.NodeAffinity
	if p.OwnNodeAffinity == nil {
		p.OwnNodeAffinity = &v1.NodeAffinity{}
	}
	return p
}

// podRequests are the requests kube-scheduler counts for the pod,
// including resized and pod-level resources.
func podRequests(pod *v1.Pod) v1.ResourceList {
	return resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{
		UseStatusResources: true, InPlacePodLevelResourcesVerticalScalingEnabled: true,
	})
}

// NodeUsage sums, per node, what the pods there take from its
// allocatable: their requests and one pod slot each. Keep one up to date
// from pod events (Add on add, Remove of the old object then Add of the
// new on update, Remove on delete) and pass it to NewSnapshot with
// WithUsed. Finished pods take nothing. Not safe for concurrent use.
type NodeUsage map[string]v1.ResourceList

// Add counts pod against node; an empty node or a finished pod adds
// nothing.
func (u NodeUsage) Add(node string, pod *v1.Pod) {
	if node == "" || finished(pod) {
		return
	}
	u.addRequests(node, podRequests(pod))
}

// addRequests counts a pod with requests l against node.
func (u NodeUsage) addRequests(node string, l v1.ResourceList) {
	u.addList(node, l)
	u.addList(node, v1.ResourceList{v1.ResourcePods: *resource.NewQuantity(1, resource.DecimalSI)})
}

// addList adds l to what node's pods take.
func (u NodeUsage) addList(node string, l v1.ResourceList) {
	sum := u[node]
	if sum == nil {
		sum = v1.ResourceList{}
		u[node] = sum
	}
	for name, q := range l {
		v := sum[name]
		v.Add(q)
		sum[name] = v
	}
}

// subRequests takes back what addRequests counted for a pod with
// requests l.
func (u NodeUsage) subRequests(node string, l v1.ResourceList) {
	sum := u[node]
	if sum == nil {
		return
	}
	for name, q := range l {
		v := sum[name]
		v.Sub(q)
		sum[name] = v
	}
	pods := sum[v1.ResourcePods]
	pods.Sub(*resource.NewQuantity(1, resource.DecimalSI))
	sum[v1.ResourcePods] = pods
}

// Remove takes back what Add counted for the same pod object.
func (u NodeUsage) Remove(node string, pod *v1.Pod) {
	l := u[node]
	if l == nil || finished(pod) {
		return
	}
	for name, q := range podUsage(pod) {
		sum := l[name]
		sum.Sub(q)
		l[name] = sum
	}
	if pods := l[v1.ResourcePods]; pods.Sign() <= 0 {
		delete(u, node)
	}
}

func (u NodeUsage) clone() NodeUsage {
	if u == nil {
		return nil
	}
	out := make(NodeUsage, len(u))
	for node, l := range u {
		out[node] = l.DeepCopy()
	}
	return out
}

func finished(pod *v1.Pod) bool {
	return pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed
}

func podUsage(pod *v1.Pod) v1.ResourceList {
	l := podRequests(pod)
	l[v1.ResourcePods] = *resource.NewQuantity(1, resource.DecimalSI)
	return l
}

// SnapshotOption adds to what a snapshot records.
type SnapshotOption func(*Snapshot)

// WithUsed records what the pods bound or assigned to each node already
// take from its allocatable. It is read once, when the snapshot is taken;
// several add up. A pod held by a Reservation is counted there, not here.
func WithUsed(used NodeUsage) SnapshotOption {
	return func(s *Snapshot) {
		for name, l := range used {
			if i, ok := s.cluster.byName[name]; ok && s.cluster.nodes[i].alloc != nil {
				s.usedRes.set(i, s.cluster.res.add(s.usedRes.at(i), l))
			}
		}
	}
}

// resources numbers the resource names that the nodes' allocatable lists,
// so requests and free amounts are plain vectors.
type resources struct {
	names []v1.ResourceName
	idx   map[v1.ResourceName]int
}

func (r *resources) init(infos []NodeInfo) {
	set := map[v1.ResourceName]bool{}
	for _, in := range infos {
		if in.Allocatable != nil {
			set[v1.ResourcePods] = true // a missing count allows no pod
		}
		for name := range in.Allocatable {
			set[name] = true
		}
	}
	r.idx = map[v1.ResourceName]int{}
	for name := range set {
		r.names = append(r.names, name)
	}
	slices.Sort(r.names)
	for i, name := range r.names {
		r.idx[name] = i
	}
}

// covers reports whether the tree's resource numbering has every
// resource alloc names, and the pod count that any allocatable implies.
func (r *resources) covers(alloc v1.ResourceList) bool {
	for name := range alloc {
		if _, ok := r.idx[name]; !ok {
			return false
		}
	}
	if alloc != nil {
		if _, ok := r.idx[v1.ResourcePods]; !ok {
			return false
		}
	}
	return true
}

// amount is a quantity in the unit kube-scheduler compares: millicores
// for cpu, whole units (rounded up) for everything else.
func amount(name v1.ResourceName, q resource.Quantity) int64 {
	if name == v1.ResourceCPU {
		return q.MilliValue()
	}
	return q.Value()
}

// vector converts l; names no node offers are left out.
func (r *resources) vector(l v1.ResourceList) []int64 {
	return r.add(make([]int64, len(r.names)), l)
}

// add adds l to v, allocating v when nil.
func (r *resources) add(v []int64, l v1.ResourceList) []int64 {
	for name, q := range l {
		i, ok := r.idx[name]
		if !ok {
			continue
		}
		if v == nil {
			v = make([]int64, len(r.names))
		}
		v[i] += amount(name, q)
	}
	return v
}

func at(v []int64, i int) int64 {
	if v == nil {
		return 0
	}
	return v[i]
}

// needs is what a shape of pod asks of a node besides devices.
type needs struct {
	affinity    nodeaffinity.RequiredNodeAffinity
	volumes     []*nodeaffinity.LazyErrorNodeSelector // Pod.Volumes
	tolerations []v1.Toleration
	req         []int64         // by resource index, one pod slot included
	unoffered   v1.ResourceName // requested, but no node offers it
}

// constraintKey tells shapes of equal claims but different node
// constraints apart.
func constraintKey(pod Pod) (string, error) {
	if pod.NodeSelector == nil && pod.NodeAffinity == nil && pod.Tolerations == nil && pod.Requests == nil && pod.Volumes == nil {
		return "", nil
	}
	raw, err := json.Marshal([]any{pod.NodeSelector, pod.NodeAffinity, pod.Tolerations, pod.Requests, pod.Volumes})
	if err != nil {
		return "", fmt.Errorf("encode the node constraints of pod %s: %w", pod.Name, err)
	}
	return string(raw), nil
}

func (c *Cluster) needsOf(pod Pod) (needs, error) {
	n := needs{tolerations: pod.Tolerations}
	if pod.NodeAffinity != nil && pod.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		if _, err := nodeaffinity.NewNodeSelector(pod.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution); err != nil {
			return n, fmt.Errorf("pod %s has an invalid required node affinity, fix it in the pod template: %w", pod.Name, err)
		}
	}
	n.affinity = nodeaffinity.NewRequiredNodeAffinity(pod.NodeSelector, &v1.Affinity{NodeAffinity: pod.NodeAffinity})
	for _, sel := range pod.Volumes {
		// Read as kube-scheduler reads a volume's node affinity: a term
		// that does not parse matches no node, and fails nothing else.
		n.volumes = append(n.volumes, nodeaffinity.NewLazyErrorNodeSelector(sel))
	}
	if len(c.res.names) == 0 {
		return n, nil
	}
	n.req = c.res.vector(pod.Requests)
	n.req[c.res.idx[v1.ResourcePods]]++
	for _, name := range slices.Sorted(maps.Keys(pod.Requests)) {
		if _, ok := c.res.idx[name]; !ok && amount(name, pod.Requests[name]) > 0 {
			n.unoffered = name
			break
		}
	}
	return n, nil
}

// NodeFilter names why a pod cannot use a node whatever its devices.
type NodeFilter string

const (
	// FilterNotReady: the node's Ready condition is not True.
	FilterNotReady NodeFilter = "NotReady"
	// FilterCordoned: the node is marked unschedulable and the pod does not
	// tolerate that.
	FilterCordoned NodeFilter = "Cordoned"
	// FilterTaint: a NoSchedule or NoExecute taint the pod does not
	// tolerate; Detail is the taint.
	FilterTaint NodeFilter = "Taint"
	// FilterAffinity: the pod's nodeSelector or required node affinity
	// does not match the node's labels.
	FilterAffinity NodeFilter = "Affinity"
	// FilterResources: what is left of the node's allocatable after the
	// pods already there cannot hold the pod; Detail is the resource.
	FilterResources NodeFilter = "Resources"
	// FilterVolumes: the pod's PersistentVolumeClaims cannot be used on
	// the node (Pod.Volumes), as kube-scheduler's VolumeBinding and
	// VolumeZone filters judge them.
	FilterVolumes NodeFilter = "Volumes"
	// FilterTopologyKey: the node lacks a node label that the job's
	// topology constraint (Job.TopologyKeys) names; Detail is the key.
	FilterTopologyKey NodeFilter = "TopologyKey"
)

var filterOrder = []NodeFilter{FilterNotReady, FilterCordoned, FilterTaint, FilterAffinity, FilterVolumes, FilterTopologyKey, FilterResources}

// FilteredNodes counts the nodes one filter ruled out.
type FilteredNodes struct {
	Filter NodeFilter
	Detail string
	Nodes  int
}

func (f FilteredNodes) String() string {
	switch f.Filter {
	case FilterNotReady:
		return fmt.Sprintf("%d NotReady", f.Nodes)
	case FilterCordoned:
		return fmt.Sprintf("%d cordoned", f.Nodes)
	case FilterTaint:
		return fmt.Sprintf("%d with untolerated taint %s", f.Nodes, f.Detail)
	case FilterAffinity:
		return fmt.Sprintf("%d not matching the pod's node selector or affinity", f.Nodes)
	case FilterVolumes:
		return fmt.Sprintf("%d where the pod's volumes cannot be used", f.Nodes)
	case FilterResources:
		return fmt.Sprintf("%d without enough %s", f.Nodes, f.Detail)
	case FilterTopologyKey:
		return fmt.Sprintf("%d without node label %s (the pod group's topology key)", f.Nodes, f.Detail)
	}
	return fmt.Sprintf("%d %s %s", f.Nodes, f.Filter, f.Detail)
}

func filteredSentence(fs []FilteredNodes) string {
	total := 0
	parts := make([]string, len(fs))
	for i, f := range fs {
		total += f.Nodes
		parts[i] = f.String()
	}
	return fmt.Sprintf("%s ruled out for the job's pods: %s", plural(total, "node"), strings.Join(parts, ", "))
}

// nodeFilters holds, for one shape, which nodes its pods may use.
type nodeFilters struct {
	why    []NodeFilter // by node; empty where the pod may go
	taint  []v1.Taint   // by node, for FilterTaint
	passed int          // nodes the pod may go to
}

// filterNodes applies the filters that do not depend on what is in use.
func (st *state) filterNodes(logger klog.Logger) {
	st.filters = make([]nodeFilters, len(st.f.shapes))
	st.usable = st.sc.usable
	for s := range st.f.shapes {
		nf := nodeFilters{why: st.sc.why(s, len(st.c.nodes))}
		ns := &st.f.shapes[s].needs
		for i, nd := range st.c.nodes {
			nf.why[i] = nd.filter(logger, ns, &nf, i)
			if nf.why[i] == "" && st.lacksKey(nd) != "" {
				nf.why[i] = FilterTopologyKey
			}
			if nf.why[i] == "" {
				nf.passed++
				st.usable[i] = true
			}
		}
		st.filters[s] = nf
	}
}

var unschedulableTaint = v1.Taint{Key: v1.TaintNodeUnschedulable, Effect: v1.TaintEffectNoSchedule}

func (nd *node) filter(logger klog.Logger, ns *needs, nf *nodeFilters, i int) NodeFilter {
	switch {
	case nd.notReady:
		return FilterNotReady
	case !nd.schedulable && !corev1helpers.TolerationsTolerateTaint(logger, ns.tolerations, &unschedulableTaint, true):
		return FilterCordoned
	}
	if len(nd.taints) > 0 {
		taint, bad := corev1helpers.FindMatchingUntoleratedTaint(logger, nd.taints, ns.tolerations, func(t *v1.Taint) bool {
			return t.Effect == v1.TaintEffectNoSchedule || t.Effect == v1.TaintEffectNoExecute
		}, true)
		if bad {
			if nf.taint == nil {
				nf.taint = make([]v1.Taint, len(nf.why))
			}
			nf.taint[i] = taint
			return FilterTaint
		}
	}
	if ok, err := ns.affinity.Match(nd.obj); !ok || err != nil {
		return FilterAffinity
	}
	for _, vs := range ns.volumes {
		if ok, _ := vs.Match(nd.obj); !ok {
			return FilterVolumes
		}
	}
	return ""
}

// room is how many pods of shape s the node's allocatable still holds,
// up to limit, on top of what is in use and of planned.
func (st *state) room(s, n int, planned []int64, limit int) int {
	return st.roomOn(s, n, limit, st.resBase.at(n), planned)
}

// roomEmpty is room on the node with nothing in use.
func (st *state) roomEmpty(s, n, limit int) int { return st.roomOn(s, n, limit, nil, nil) }

func (st *state) roomOn(s, n, limit int, used, planned []int64) int {
	nd := st.c.nodes[n]
	ns := &st.f.shapes[s].needs
	if nd.alloc == nil || ns.req == nil {
		return limit
	}
	if ns.unoffered != "" {
		return 0
	}
	k := limit
	for i, r := range ns.req {
		if r > 0 {
			free := nd.alloc[i] - at(used, i) - at(planned, i)
			k = min(k, int(max(free, 0)/r))
		}
	}
	return k
}

// lacking names the first resource that keeps a pod of shape s off n.
func (st *state) lacking(s, n int) string {
	nd := st.c.nodes[n]
	ns := &st.f.shapes[s].needs
	if ns.unoffered != "" {
		return string(ns.unoffered)
	}
	for i, r := range ns.req {
		if r > 0 && nd.alloc[i]-at(st.resBase.at(n), i) < r {
			return string(st.c.res.names[i])
		}
	}
	return ""
}

// filtered counts the nodes in scope (nil: all) that no pod of the job
// can use, each under the reason that keeps the job's first pod off it.
// Nodes without devices are left out when every pod needs some.
func (st *state) filtered(scope []int) []FilteredNodes {
	if scope == nil {
		scope = make([]int, len(st.c.nodes))
		for i := range scope {
			scope[i] = i
		}
	}
	first := st.podShape[st.podOrder[0]]
	counts := map[FilteredNodes]int{}
	for _, n := range scope {
		if nd := st.c.nodes[n]; nd.gone || (st.minNeed > 0 && len(nd.devs) == 0 && nd.reach.mask == nil) {
			continue
		}
		var usable bool
		if st.roomy != nil { // the counts found it already
			usable = st.roomy[n]
		} else {
			for s := range st.f.shapes {
				usable = usable || (st.filters[s].why[n] == "" && st.room(s, n, nil, 1) > 0)
			}
		}
		if usable {
			continue
		}
		key := FilteredNodes{Filter: st.filters[first].why[n]}
		switch key.Filter {
		case FilterTaint:
			key.Detail = st.filters[first].taint[n].ToString()
		case FilterTopologyKey:
			key.Detail = st.lacksKey(st.c.nodes[n])
		case "":
			key.Filter, key.Detail = FilterResources, st.lacking(first, n)
		}
		counts[key]++
	}
	var out []FilteredNodes
	for k, v := range counts {
		k.Nodes = v
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b FilteredNodes) int {
		if d := slices.Index(filterOrder, a.Filter) - slices.Index(filterOrder, b.Filter); d != 0 {
			return d
		}
		return strings.Compare(a.Detail, b.Detail)
	})
	return out
}
