package controller

import (
	"fmt"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
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
//     topologies).
//
// Not weighed: a CSI driver's storage capacity and its volume limits per
// node (CSINode), and two pods of a group wanting one available volume.
// kube-scheduler refuses a pod those keep off its planned node, and the
// controller plans it again elsewhere (refusedNode).

// volumeView reads what a pod's volumes hold it to.
type volumeView struct {
	pvcs    corelisters.PersistentVolumeClaimLister
	pvs     corelisters.PersistentVolumeLister
	pvIdx   cache.Indexer // the PersistentVolumes by storage class
	classes storagelisters.StorageClassLister
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

// pvcIndex indexes pods by the PersistentVolumeClaims their volumes name
// (namespace/name).
const pvcIndex = "pvc"

func indexByPVC(obj any) ([]string, error) {
	p, ok := obj.(*v1.Pod)
	if !ok {
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
	var bound []*v1.PersistentVolume
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
		if pvc.Spec.VolumeName != "" && metav1.HasAnnotation(pvc.ObjectMeta, volumehelpers.AnnBindCompleted) {
			pv, err := v.pvs.Get(pvc.Spec.VolumeName)
			if err != nil {
				return nil, fmt.Sprintf("PersistentVolume %s, bound to PersistentVolumeClaim %s, does not exist", pvc.Spec.VolumeName, name)
			}
			if pv.Spec.NodeAffinity != nil && pv.Spec.NodeAffinity.Required != nil {
				sels = append(sels, pv.Spec.NodeAffinity.Required)
			}
			bound = append(bound, pv)
			continue
		}
		delay, err := volumehelpers.IsDelayBindingMode(pvc, v.classes)
		if err != nil {
			return nil, fmt.Sprintf("PersistentVolumeClaim %s: %v", name, err)
		}
		if !delay || pvc.Spec.VolumeName != "" {
			return nil, fmt.Sprintf("PersistentVolumeClaim %s is not bound yet, and its binding is immediate: the pod waits until it is", name)
		}
		sel, why := v.delayed(pvc)
		if why != "" {
			return nil, why
		}
		if sel != nil {
			sels = append(sels, sel)
		}
	}
	if sel := zoneSelector(bound); sel != nil {
		sels = append(sels, sel)
	}
	return sels, ""
}

// delayed is where a claim that waits for its first consumer may be bound
// or provisioned: nil for every node.
func (v volumeView) delayed(pvc *v1.PersistentVolumeClaim) (*v1.NodeSelector, string) {
	if node, ok := pvc.Annotations[volumehelpers.AnnSelectedNode]; ok {
		return nodeNamed(node), ""
	}
	className := volumehelpers.GetPersistentVolumeClaimClass(pvc)
	var terms []v1.NodeSelectorTerm
	objs, _ := v.pvIdx.ByIndex(pvClassIndex, className)
	for _, o := range objs {
		pv := o.(*v1.PersistentVolume)
		// FindMatchingVolume checks the node's labels against the
		// volume's node affinity; the node affinity is what is asked
		// here, so it matches a copy without it.
		free := *pv
		free.Spec.NodeAffinity = nil
		if m, err := volumehelpers.FindMatchingVolume(pvc, []*v1.PersistentVolume{&free}, &v1.Node{}, nil, true, true); err != nil || m == nil {
			continue
		}
		if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
			return nil, "" // it binds on any node
		}
		terms = append(terms, pv.Spec.NodeAffinity.Required.NodeSelectorTerms...)
	}
	class, err := v.classes.Get(className)
	if err == nil && class.Provisioner != "" && class.Provisioner != volumehelpers.NotSupportedProvisioner {
		if len(class.AllowedTopologies) == 0 {
			return nil, "" // provisioned for any node
		}
		terms = append(terms, topologyTerms(class)...)
	}
	if len(terms) == 0 {
		why := fmt.Sprintf("no available PersistentVolume can bind PersistentVolumeClaim %s", pvc.Name)
		switch {
		case className == "":
			why += ", which names no storage class to provision one"
		case err != nil:
			why += fmt.Sprintf(", and its StorageClass %s does not exist", className)
		default:
			why += fmt.Sprintf(", and its StorageClass %s does not provision volumes", className)
		}
		return nil, why
	}
	return &v1.NodeSelector{NodeSelectorTerms: terms}, ""
}

// topologyTerms are a class's allowed topologies as node selector terms.
func topologyTerms(class *storagev1.StorageClass) []v1.NodeSelectorTerm {
	var out []v1.NodeSelectorTerm
	for _, t := range class.AllowedTopologies {
		var term v1.NodeSelectorTerm
		for _, e := range t.MatchLabelExpressions {
			term.MatchExpressions = append(term.MatchExpressions, v1.NodeSelectorRequirement{Key: e.Key, Operator: v1.NodeSelectorOpIn, Values: e.Values})
		}
		out = append(out, term)
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

// zoneSelector is VolumeZone's filter for the bound volumes: a node that
// carries none of the zone and region labels takes them; any other must
// carry, for each such label of each volume, one of the values it lists
// (zones joined by "__"), under the same key or, for a beta key the node
// lacks, under its GA key. Nil when no volume carries such a label.
func zoneSelector(pvs []*v1.PersistentVolume) *v1.NodeSelector {
	alts := [][]v1.NodeSelectorRequirement{nil}
	found := false
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
			found = true
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
	}
	if !found {
		return nil
	}
	sel := &v1.NodeSelector{}
	for _, a := range alts {
		sel.NodeSelectorTerms = append(sel.NodeSelectorTerms, v1.NodeSelectorTerm{MatchExpressions: a})
	}
	var none v1.NodeSelectorTerm
	for _, l := range zoneLabels {
		none.MatchExpressions = append(none.MatchExpressions, v1.NodeSelectorRequirement{Key: l.key, Operator: v1.NodeSelectorOpDoesNotExist})
	}
	return &v1.NodeSelector{NodeSelectorTerms: append(sel.NodeSelectorTerms, none)}
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
		if !slices.Contains(out, z) {
			out = append(out, z)
		}
	}
	slices.Sort(out)
	return out, true
}

// onVolume requeues the groups whose pods a PersistentVolumeClaim,
// PersistentVolume or StorageClass event may let go to more nodes or
// fewer: the pods that use the claim, or that a volume bound to it holds;
// for a volume not bound yet and for a class, every pod not bound yet that
// uses a claim.
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
	for _, k := range keys {
		objs, _ := c.podIdx.ByIndex(pvcIndex, k)
		for _, o := range objs {
			if p := o.(*v1.Pod); p.Spec.NodeName == "" {
				if key, ok := groupKey(p); ok {
					c.queue.Add(key)
				}
			}
		}
	}
}
