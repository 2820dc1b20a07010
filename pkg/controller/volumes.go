package controller

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/component-helpers/storage/ephemeral"
	volumehelpers "k8s.io/component-helpers/storage/volume"
)

// Volumes, as kube-scheduler's VolumeBinding and VolumeZone filters weigh
// them. A pod's PersistentVolumeClaims hold it to some nodes, or to none
// for now:
//   - a claim that is missing, being deleted or lost, an ephemeral
//     volume's claim that another pod owns, a claim not bound whose
//     binding is immediate, and a bound claim whose PersistentVolume is
//     missing keep the pod off every node: the group waits, as
//     kube-scheduler leaves the pod pending;
//   - a bound claim's PersistentVolume holds the pod to the nodes its node
//     affinity selects, and to the zones and regions its topology labels
//     name (on nodes that carry any such label);
//   - a claim that waits for its first consumer holds the pod to the node
//     kube-scheduler already chose for it (volume.kubernetes.io/selected-node),
//     else to the nodes where an available PersistentVolume of its class
//     could bind it or its class could provision one (the class's allowed
//     topologies, and where its CSI driver publishes storage capacity, the
//     topologies with room for it).
//
//   - a ReadWriteOncePod claim that a pod on a node uses keeps every other
//     pod that names it pending (VolumeRestrictions).
//
// Not weighed: a CSI driver's volume limits per node (CSINode), two pods
// of a group naming one ReadWriteOncePod claim, and two claims of a pod,
// or two pods of a group, wanting one available volume. kube-scheduler refuses a
// pod those keep off its planned node, and the controller plans it again
// elsewhere (refusedNode).

// volumeView reads what a pod's volumes hold it to.
type volumeView struct {
	pvcs    corelisters.PersistentVolumeClaimLister
	pvs     corelisters.PersistentVolumeLister
	pvIdx   cache.Indexer // the PersistentVolumes by storage class
	classes storagelisters.StorageClassLister
	// drivers and capacities are the CSI drivers and the storage capacity
	// they publish; nil drivers checks no capacity.
	drivers    storagelisters.CSIDriverLister
	capacities storagelisters.CSIStorageCapacityLister
	// users are the pods by pvcUserIndex; nil checks no
	// ReadWriteOncePod claim.
	users cache.Indexer
}

// pvClassIndex indexes PersistentVolumes by their storage class.
const pvClassIndex = "class"

func indexPVByClass(obj any) ([]string, error) {
	pv, ok := obj.(*v1.PersistentVolume)
	if !ok {
		return nil, nil
	}
	return []string{volumehelpers.GetPersistentVolumeClass(pv)}, nil
}

// pvcIndex indexes the pods of groups that are not bound yet by the
// PersistentVolumeClaims their volumes name (namespace/name): the pods
// whose plans those claims decide.
const pvcIndex = "pvc"

func indexByPVC(obj any) ([]string, error) {
	p, ok := obj.(*v1.Pod)
	if !ok || p.Spec.NodeName != "" {
		return nil, nil
	}
	if _, ok := groupKey(p); !ok {
		return nil, nil
	}
	var out []string
	for i := range p.Spec.Volumes {
		if name := claimNameOf(p, &p.Spec.Volumes[i]); name != "" {
			out = append(out, p.Namespace+"/"+name)
		}
	}
	return out, nil
}

// pvcUserIndex indexes the pods kube-scheduler counts as using a
// PersistentVolumeClaim, by the claims their volumes name
// (namespace/name): pods on a node that have not finished. A
// ReadWriteOncePod claim one of them uses keeps every other pod pending.
const pvcUserIndex = "pvcUser"

func indexByPVCUser(obj any) ([]string, error) {
	p, ok := obj.(*v1.Pod)
	if !ok || p.Spec.NodeName == "" || finished(p) {
		return nil, nil
	}
	var out []string
	for _, vol := range p.Spec.Volumes {
		if vol.PersistentVolumeClaim != nil {
			out = append(out, p.Namespace+"/"+vol.PersistentVolumeClaim.ClaimName)
		}
	}
	return out, nil
}

// claimNameOf is the PersistentVolumeClaim the volume names, "" for a
// volume of another kind.
func claimNameOf(p *v1.Pod, vol *v1.Volume) string {
	switch {
	case vol.PersistentVolumeClaim != nil:
		return vol.PersistentVolumeClaim.ClaimName
	case vol.Ephemeral != nil:
		return ephemeral.VolumeClaimName(p, vol)
	}
	return ""
}

// nodes returns the node selectors the pod's volumes hold it to (every one
// must match), or why no node can take it now.
func (v volumeView) nodes(p *v1.Pod) ([]*v1.NodeSelector, string) {
	var sels []*v1.NodeSelector
	var zoned []*v1.PersistentVolume // VolumeZone reads only claims named in persistentVolumeClaim
	for i := range p.Spec.Volumes {
		vol := &p.Spec.Volumes[i]
		name := claimNameOf(p, vol)
		if name == "" {
			continue
		}
		pvc, err := v.pvcs.PersistentVolumeClaims(p.Namespace).Get(name)
		switch {
		case apierrors.IsNotFound(err) && vol.Ephemeral != nil:
			return nil, fmt.Sprintf("waiting for the ephemeral volume controller to create PersistentVolumeClaim %s of volume %s", name, vol.Name)
		case apierrors.IsNotFound(err):
			return nil, fmt.Sprintf("PersistentVolumeClaim %s of volume %s does not exist; create it", name, vol.Name)
		case err != nil:
			return nil, fmt.Sprintf("PersistentVolumeClaim %s: %v", name, err)
		case pvc.Status.Phase == v1.ClaimLost:
			return nil, fmt.Sprintf("PersistentVolumeClaim %s is bound to PersistentVolume %s, which no longer exists", name, pvc.Spec.VolumeName)
		case pvc.DeletionTimestamp != nil:
			return nil, fmt.Sprintf("PersistentVolumeClaim %s is being deleted", name)
		}
		if vol.Ephemeral != nil {
			if err := ephemeral.VolumeIsForPod(p, pvc); err != nil {
				return nil, err.Error()
			}
		}
		if vol.PersistentVolumeClaim != nil && slices.Contains(pvc.Spec.AccessModes, v1.ReadWriteOncePod) {
			if user := v.otherUser(p, name); user != nil {
				return nil, fmt.Sprintf("PersistentVolumeClaim %s can be used by one pod only (ReadWriteOncePod), and pod %s on node %s uses it", name, user.Name, user.Spec.NodeName)
			}
		}
		if pvc.Spec.VolumeName != "" && metav1.HasAnnotation(pvc.ObjectMeta, volumehelpers.AnnBindCompleted) {
			pv, err := v.pvs.Get(pvc.Spec.VolumeName)
			if err != nil {
				return nil, fmt.Sprintf("PersistentVolume %s, bound to PersistentVolumeClaim %s, does not exist", pvc.Spec.VolumeName, name)
			}
			if terms, anywhere := volumeTerms(pv); !anywhere {
				sels = append(sels, &v1.NodeSelector{NodeSelectorTerms: terms})
			}
			if vol.PersistentVolumeClaim != nil {
				zoned = append(zoned, pv)
			}
			continue
		}
		if why := v.unbound(pvc); why != "" {
			return nil, why
		}
		sel, why := v.delayed(pvc)
		if why != "" {
			return nil, why
		}
		if sel != nil {
			sels = append(sels, sel)
		}
	}
	if sel := zoneSelector(zoned); sel != nil {
		sels = append(sels, sel)
	}
	return sels, ""
}

// otherUser is a pod other than p that kube-scheduler counts as using
// claim name of p's namespace (VolumeRestrictions), nil when none does.
func (v volumeView) otherUser(p *v1.Pod, name string) *v1.Pod {
	if v.users == nil {
		return nil
	}
	objs, _ := v.users.ByIndex(pvcUserIndex, p.Namespace+"/"+name)
	for _, o := range objs {
		if u := o.(*v1.Pod); u.UID != p.UID {
			return u
		}
	}
	return nil
}

// unbound says why a claim not bound yet keeps its pod pending, "" when it
// waits for its first consumer, which decides where it is bound.
func (v volumeView) unbound(pvc *v1.PersistentVolumeClaim) string {
	delay, err := volumehelpers.IsDelayBindingMode(pvc, v.classes)
	className := volumehelpers.GetPersistentVolumeClaimClass(pvc)
	switch {
	case err != nil:
		return fmt.Sprintf("PersistentVolumeClaim %s: %v", pvc.Name, err)
	case delay && pvc.Spec.VolumeName == "":
		return ""
	case pvc.Spec.VolumeName != "":
		return fmt.Sprintf("PersistentVolumeClaim %s names PersistentVolume %s, which is not bound to it yet: the pod waits until it is", pvc.Name, pvc.Spec.VolumeName)
	case className == "":
		return fmt.Sprintf("PersistentVolumeClaim %s is not bound yet and names no StorageClass: the pod waits until it is bound", pvc.Name)
	}
	if _, err := v.classes.Get(className); err != nil {
		return fmt.Sprintf("PersistentVolumeClaim %s is not bound yet, and its StorageClass %s does not exist: the pod waits until it is bound", pvc.Name, className)
	}
	return fmt.Sprintf("PersistentVolumeClaim %s is not bound yet, and its binding is immediate: the pod waits until it is", pvc.Name)
}

// delayed is where a claim that waits for its first consumer may be bound
// or provisioned: nil for every node. A volume made for the claim (bound
// to it from the volume's side) is the only one kube-scheduler tries.
func (v volumeView) delayed(pvc *v1.PersistentVolumeClaim) (*v1.NodeSelector, string) {
	className := volumehelpers.GetPersistentVolumeClaimClass(pvc)
	class, classErr := v.classes.Get(className)
	provisions := classErr == nil && class.Provisioner != "" && class.Provisioner != volumehelpers.NotSupportedProvisioner
	var made []v1.NodeSelectorTerm // nil: every node
	if provisions {
		made = topologyTerms(class)
		if capacity, limited := v.capacity(pvc, class); limited {
			made = andTerms(made, capacity)
		}
	}
	if node, ok := pvc.Annotations[volumehelpers.AnnSelectedNode]; ok {
		if !provisions {
			return nil, fmt.Sprintf("PersistentVolumeClaim %s waits for a volume made on node %s, and its StorageClass %s does not provision volumes", pvc.Name, node, className)
		}
		return &v1.NodeSelector{NodeSelectorTerms: compactTerms(andTerms(nodeNamed(node).NodeSelectorTerms, made))}, ""
	}
	var candidates []*v1.PersistentVolume
	objs, _ := v.pvIdx.ByIndex(pvClassIndex, className)
	for _, o := range objs {
		pv := o.(*v1.PersistentVolume)
		if pv.Spec.ClaimRef != nil && !volumehelpers.IsVolumeBoundToClaim(pv, pvc) {
			continue // another claim's
		}
		// FindMatchingVolume checks the node's labels against the
		// volume's node affinity; the node affinity is what is asked
		// here, so it matches a copy without it.
		free := *pv
		free.Spec.NodeAffinity = nil
		if m, err := volumehelpers.FindMatchingVolume(pvc, []*v1.PersistentVolume{&free}, &v1.Node{}, nil, true, true); err != nil || m == nil {
			continue
		}
		if volumehelpers.IsVolumeBoundToClaim(pv, pvc) {
			candidates = []*v1.PersistentVolume{pv}
			break
		}
		candidates = append(candidates, pv)
	}
	var terms []v1.NodeSelectorTerm
	for _, pv := range candidates {
		t, anywhere := volumeTerms(pv)
		if anywhere {
			return nil, "" // it binds on any node
		}
		terms = append(terms, t...)
	}
	if provisions {
		if made == nil {
			return nil, "" // provisioned for any node
		}
		terms = append(terms, made...)
	}
	if len(terms) == 0 {
		return nil, fmt.Sprintf("no available PersistentVolume can bind PersistentVolumeClaim %s, and its StorageClass %s does not provision volumes", pvc.Name, className)
	}
	return &v1.NodeSelector{NodeSelectorTerms: compactTerms(terms)}, ""
}

// volumeTerms are the terms of a volume's node affinity as
// kube-scheduler's CheckNodeAffinity reads them: against a node with
// labels and no name, so field requirements (metadata.name) are passed
// over, and a term of field requirements alone matches every node; an
// empty term matches none. anywhere: the volume may be used on every node.
func volumeTerms(pv *v1.PersistentVolume) (terms []v1.NodeSelectorTerm, anywhere bool) {
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return nil, true
	}
	for _, t := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
		switch {
		case len(t.MatchExpressions) > 0:
			terms = append(terms, v1.NodeSelectorTerm{MatchExpressions: t.MatchExpressions})
		case len(t.MatchFields) > 0:
			return nil, true
		}
	}
	if terms == nil {
		terms = noNode()
	}
	return terms, false
}

// noNode is a selector's terms that no node matches: a term without
// requirements would be passed over, and no terms at all may read as no
// constraint.
func noNode() []v1.NodeSelectorTerm {
	return []v1.NodeSelectorTerm{{MatchFields: []v1.NodeSelectorRequirement{{Key: metav1.ObjectNameField, Operator: v1.NodeSelectorOpIn, Values: []string{""}}}}}
}

// validValues reports whether every value is a label value: a term with
// one that is not matches no node, and joined with others it would take
// them down with it.
func validValues(vals []string) bool {
	return !slices.ContainsFunc(vals, func(v string) bool { return len(validation.IsValidLabelValue(v)) > 0 })
}

// compactTerms sorts the terms, drops repeats, and joins the terms that
// are each one In requirement on the same key (as one volume per node
// gives): the planner matches fewer terms.
func compactTerms(terms []v1.NodeSelectorTerm) []v1.NodeSelectorTerm {
	in := map[string][]string{}
	var out []v1.NodeSelectorTerm
	for _, t := range terms {
		if len(t.MatchFields) == 0 && len(t.MatchExpressions) == 1 && t.MatchExpressions[0].Operator == v1.NodeSelectorOpIn && validValues(t.MatchExpressions[0].Values) {
			r := t.MatchExpressions[0]
			in[r.Key] = append(in[r.Key], r.Values...)
			continue
		}
		out = append(out, t)
	}
	for k, vals := range in {
		slices.Sort(vals)
		out = append(out, v1.NodeSelectorTerm{MatchExpressions: []v1.NodeSelectorRequirement{{Key: k, Operator: v1.NodeSelectorOpIn, Values: slices.Compact(vals)}}})
	}
	key := func(t v1.NodeSelectorTerm) string { return t.String() }
	slices.SortFunc(out, func(a, b v1.NodeSelectorTerm) int { return strings.Compare(key(a), key(b)) })
	return slices.CompactFunc(out, func(a, b v1.NodeSelectorTerm) bool { return key(a) == key(b) })
}

// capacity is where the class's CSI driver, when it publishes its
// storage capacity (CSIDriver storageCapacity), has room for the claim:
// the node topologies of the class's CSIStorageCapacity objects whose
// maximum volume size (else capacity) holds the claim's request. limited
// is false when the driver does not publish it or the claim asks no size,
// as kube-scheduler then checks none; an empty list with limited true
// means no node.
func (v volumeView) capacity(pvc *v1.PersistentVolumeClaim, class *storagev1.StorageClass) (terms []v1.NodeSelectorTerm, limited bool) {
	size, ok := pvc.Spec.Resources.Requests[v1.ResourceStorage]
	if !ok || v.drivers == nil {
		return nil, false
	}
	driver, err := v.drivers.Get(class.Provisioner)
	if err != nil || driver.Spec.StorageCapacity == nil || !*driver.Spec.StorageCapacity {
		return nil, false
	}
	caps, _ := v.capacities.List(everything)
	for _, c := range caps {
		limit := c.MaximumVolumeSize
		if limit == nil {
			limit = c.Capacity
		}
		if c.StorageClassName != class.Name || limit == nil || limit.Value() < size.Value() || c.NodeTopology == nil {
			continue
		}
		if t, ok := labelSelectorTerm(c.NodeTopology); ok {
			terms = append(terms, t)
		}
	}
	if terms == nil {
		terms = noNode()
	}
	return terms, true
}

// labelSelectorTerm is a label selector as a node selector term; false
// for an operator a node selector has no equal of.
func labelSelectorTerm(sel *metav1.LabelSelector) (v1.NodeSelectorTerm, bool) {
	var t v1.NodeSelectorTerm
	for _, k := range slices.Sorted(maps.Keys(sel.MatchLabels)) {
		t.MatchExpressions = append(t.MatchExpressions, v1.NodeSelectorRequirement{Key: k, Operator: v1.NodeSelectorOpIn, Values: []string{sel.MatchLabels[k]}})
	}
	for _, e := range sel.MatchExpressions {
		op := v1.NodeSelectorOperator(e.Operator)
		switch op {
		case v1.NodeSelectorOpIn, v1.NodeSelectorOpNotIn, v1.NodeSelectorOpExists, v1.NodeSelectorOpDoesNotExist:
		default:
			return t, false
		}
		t.MatchExpressions = append(t.MatchExpressions, v1.NodeSelectorRequirement{Key: e.Key, Operator: op, Values: e.Values})
	}
	if len(t.MatchExpressions) == 0 {
		// An empty selector matches every node; a term without
		// requirements matches none.
		t.MatchExpressions = []v1.NodeSelectorRequirement{{Key: metav1.ObjectNameField, Operator: v1.NodeSelectorOpNotIn, Values: []string{""}}}
		t.MatchFields, t.MatchExpressions = t.MatchExpressions, nil
	}
	return t, true
}

// andTerms are the terms of two selectors joined (every pair's
// requirements together); nil stands for every node.
func andTerms(a, b []v1.NodeSelectorTerm) []v1.NodeSelectorTerm {
	if a == nil {
		return b
	}
	if b == nil {
		return a
	}
	var out []v1.NodeSelectorTerm
	for _, x := range a {
		for _, y := range b {
			out = append(out, v1.NodeSelectorTerm{
				MatchExpressions: append(slices.Clip(x.MatchExpressions), y.MatchExpressions...),
				MatchFields:      append(slices.Clip(x.MatchFields), y.MatchFields...),
			})
		}
	}
	return out
}

// topologyTerms are a class's allowed topologies as node selector terms.
func topologyTerms(class *storagev1.StorageClass) []v1.NodeSelectorTerm {
	var out []v1.NodeSelectorTerm
	for _, t := range class.AllowedTopologies {
		var term v1.NodeSelectorTerm
		for _, e := range t.MatchLabelExpressions {
			term.MatchExpressions = append(term.MatchExpressions, v1.NodeSelectorRequirement{Key: e.Key, Operator: v1.NodeSelectorOpIn, Values: e.Values})
		}
		if len(term.MatchExpressions) > 0 { // an empty term matches no node
			out = append(out, term)
		}
	}
	if out == nil && len(class.AllowedTopologies) > 0 {
		return noNode()
	}
	return out
}

// nodeNamed selects one node by name.
func nodeNamed(node string) *v1.NodeSelector {
	return &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
		MatchFields: []v1.NodeSelectorRequirement{{Key: metav1.ObjectNameField, Operator: v1.NodeSelectorOpIn, Values: []string{node}}},
	}}}
}

// zoneLabels are the node and volume labels VolumeZone compares, with
// the label a node may carry instead of each.
var zoneLabels = []struct{ key, ga string }{
	{v1.LabelFailureDomainBetaZone, v1.LabelTopologyZone},
	{v1.LabelFailureDomainBetaRegion, v1.LabelTopologyRegion},
	{v1.LabelTopologyZone, v1.LabelTopologyZone},
	{v1.LabelTopologyRegion, v1.LabelTopologyRegion},
}

// zoneSelector is VolumeZone's filter for the volumes: a node that
// carries none of the zone and region labels takes them; any other must
// carry, for each such label of each volume, one of the values it lists
// (zones joined by "__"), under the same key or, for a beta key the node
// lacks, under its GA key. Volumes that carry one key are intersected.
// Nil when no volume carries such a label.
func zoneSelector(pvs []*v1.PersistentVolume) *v1.NodeSelector {
	sets := map[string][]string{}
	for _, pv := range pvs {
		for _, l := range zoneLabels {
			value, ok := pv.Labels[l.key]
			if !ok {
				continue
			}
			zones, ok := labelZones(value)
			if !ok {
				continue // kube-scheduler ignores a label it cannot parse
			}
			if prev, seen := sets[l.key]; seen {
				zones = slices.DeleteFunc(zones, func(z string) bool { return !slices.Contains(prev, z) })
			}
			sets[l.key] = zones
		}
	}
	if len(sets) == 0 {
		return nil
	}
	alts := [][]v1.NodeSelectorRequirement{nil}
	for _, l := range zoneLabels {
		zones, ok := sets[l.key]
		if !ok {
			continue
		}
		if len(zones) == 0 {
			alts = nil // no zone is every volume's: only nodes without zone labels
			break
		}
		opts := [][]v1.NodeSelectorRequirement{{{Key: l.key, Operator: v1.NodeSelectorOpIn, Values: zones}}}
		if l.ga != l.key {
			opts = append(opts, []v1.NodeSelectorRequirement{
				{Key: l.key, Operator: v1.NodeSelectorOpDoesNotExist},
				{Key: l.ga, Operator: v1.NodeSelectorOpIn, Values: zones},
			})
		}
		var next [][]v1.NodeSelectorRequirement
		for _, a := range alts {
			for _, o := range opts {
				next = append(next, append(slices.Clip(a), o...))
			}
		}
		alts = next
	}
	sel := &v1.NodeSelector{}
	for _, a := range alts {
		sel.NodeSelectorTerms = append(sel.NodeSelectorTerms, v1.NodeSelectorTerm{MatchExpressions: a})
	}
	var none v1.NodeSelectorTerm
	for _, l := range zoneLabels {
		none.MatchExpressions = append(none.MatchExpressions, v1.NodeSelectorRequirement{Key: l.key, Operator: v1.NodeSelectorOpDoesNotExist})
	}
	sel.NodeSelectorTerms = append(sel.NodeSelectorTerms, none)
	return sel
}

// labelZones splits a volume's zone label as kube-scheduler does; false
// when a zone is empty.
func labelZones(value string) ([]string, bool) {
	var out []string
	for _, z := range strings.Split(value, "__") {
		z = strings.TrimSpace(z)
		if z == "" {
			return nil, false
		}
		if len(validation.IsValidLabelValue(z)) > 0 {
			continue // no node label has it
		}
		if !slices.Contains(out, z) {
			out = append(out, z)
		}
	}
	slices.Sort(out)
	return out, true
}

// onlyNode reports whether node is the one node the volume selectors
// allow, as the planner matches them.
func (c *Controller) onlyNode(sels []*v1.NodeSelector, node string) bool {
	nodes, err := c.nodes.List(everything)
	if err != nil {
		return false
	}
	var parsed []*nodeaffinity.LazyErrorNodeSelector
	for _, s := range sels {
		parsed = append(parsed, nodeaffinity.NewLazyErrorNodeSelector(s))
	}
	for _, n := range nodes {
		ok := true
		for _, s := range parsed {
			if m, _ := s.Match(n); !m {
				ok = false
				break
			}
		}
		if ok && n.Name != node {
			return false
		}
	}
	return true
}

// onClaimUser requeues the groups of the unbound pods that use a claim
// pod stops using: it finished, left its node or is gone, and a
// ReadWriteOncePod claim it held is free for them.
func (c *Controller) onClaimUser(pod *v1.Pod) {
	keys, _ := indexByPVCUser(pod)
	c.requeueClaimants(keys)
}

// volumeHandler calls onVolume for every change of an object, not for the
// informer's resyncs, which change nothing.
func (c *Controller) volumeHandler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{AddFunc: c.onVolume, DeleteFunc: c.onVolume, UpdateFunc: func(old, cur any) {
		o, err1 := meta.Accessor(old)
		n, err2 := meta.Accessor(cur)
		if err1 == nil && err2 == nil && o.GetResourceVersion() == n.GetResourceVersion() {
			return
		}
		c.onVolume(cur)
	}}
}

// onVolume requeues the groups whose pods a PersistentVolumeClaim,
// PersistentVolume or StorageClass event may let go to more nodes or
// fewer: the pods not bound yet that use the claim, or that a volume
// bound to it holds; for a volume not bound yet and for a class, every pod
// not bound yet that uses a claim.
func (c *Controller) onVolume(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	var keys []string
	switch o := obj.(type) {
	case *v1.PersistentVolumeClaim:
		keys = []string{o.Namespace + "/" + o.Name}
	case *v1.PersistentVolume:
		if o.Spec.ClaimRef != nil && o.Status.Phase == v1.VolumeBound {
			keys = []string{o.Spec.ClaimRef.Namespace + "/" + o.Spec.ClaimRef.Name}
		} else {
			keys = c.podIdx.ListIndexFuncValues(pvcIndex)
		}
	default:
		keys = c.podIdx.ListIndexFuncValues(pvcIndex)
	}
	c.requeueClaimants(keys)
}

// requeueClaimants requeues the groups of the unbound pods that name the
// claims keys (namespace/name).
func (c *Controller) requeueClaimants(keys []string) {
	for _, k := range keys {
		objs, _ := c.podIdx.ByIndex(pvcIndex, k)
		for _, o := range objs {
			if key, ok := groupKey(o.(*v1.Pod)); ok {
				c.queue.Add(key)
			}
		}
	}
}
