package controller

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
	"github.com/gputopo/gputopo/pkg/topology"
)

// groupIndex indexes pods by their group key.
const groupIndex = "gputopo-group"

// nodeIndex indexes the pods of groups by the node they are bound or
// steered to, so a node that is lost re-syncs just the groups on it.
const nodeIndex = "gputopo-node"

func indexByNode(obj any) ([]string, error) {
	p, ok := obj.(*v1.Pod)
	if !ok {
		return nil, nil
	}
	if _, ok := groupKey(p); !ok {
		return nil, nil
	}
	if n := usageNode(p); n != "" {
		return []string{n}, nil
	}
	return nil, nil
}

// Group kinds, the middle part of a group key.
const (
	kindGroup  = string(placement.GroupKindGroup)
	kindLWS    = string(placement.GroupKindLWS)
	kindJobSet = string(placement.GroupKindJobSet)
	kindJob    = string(placement.GroupKindJob)
	kindPod    = string(placement.GroupKindPod)
)

// Labels and annotations of the workload controllers whose pods form
// groups. They are theirs, not gputopo's, and are only read.
const (
	labelJobSetName     = "jobset.sigs.k8s.io/jobset-name"
	labelJobSetJobIndex = "jobset.sigs.k8s.io/job-index"
	labelLWSName        = "leaderworkerset.sigs.k8s.io/name"
	labelLWSGroupIndex  = "leaderworkerset.sigs.k8s.io/group-index"
	labelLWSWorkerIndex = "leaderworkerset.sigs.k8s.io/worker-index"
	annotationLWSSize   = "leaderworkerset.sigs.k8s.io/size"
	// JobSet's exclusive placement (leaders.go): the key of the topology
	// each Job of the JobSet has to itself, and the flag of its
	// node-selector strategy, which admits every pod at once.
	annotationJobSetExclusive    = "alpha.jobset.sigs.k8s.io/exclusive-topology"
	annotationJobSetNodeSelector = "alpha.jobset.sigs.k8s.io/node-selector"
)

// groupKey says which group a pod belongs to, "<namespace>/<kind>/<name>":
// the gputopo.dev/group annotation first, then a LeaderWorkerSet replica
// group, a JobSet, a Job, then the kube-scheduler PodGroup named in
// spec.schedulingGroup (a group of kind group named as the PodGroup), and
// otherwise the pod alone. ok is false for pods that did not opt in. A
// Job's PodGroup holds exactly its pods (the Job controller makes one per
// Job), so its group stays the Job's.
func groupKey(pod *v1.Pod) (key string, ok bool) {
	if !placement.OptedIn(pod.Annotations) {
		return "", false
	}
	ns := pod.Namespace + "/"
	if g := pod.Annotations[placement.AnnotationGroup]; g != "" {
		return ns + kindGroup + "/" + g, true
	}
	if name, idx := pod.Labels[labelLWSName], pod.Labels[labelLWSGroupIndex]; name != "" && idx != "" {
		return ns + kindLWS + "/" + name + "-" + idx, true
	}
	if name := pod.Labels[labelJobSetName]; name != "" {
		return ns + kindJobSet + "/" + name, true
	}
	if ref := metav1.GetControllerOf(pod); ref != nil && ref.Kind == "Job" {
		return ns + kindJob + "/" + ref.Name, true
	}
	if name := podGroupName(pod); name != "" {
		return ns + kindGroup + "/" + name, true
	}
	return ns + kindPod + "/" + pod.Name, true
}

func indexByGroup(obj any) ([]string, error) {
	pod, ok := obj.(*v1.Pod)
	if !ok {
		return nil, nil
	}
	if key, ok := groupKey(pod); ok {
		return []string{key}, nil
	}
	return nil, nil
}

// splitKey returns namespace, kind and name of a group key.
func splitKey(key string) (ns, kind, name string, err error) {
	parts := strings.SplitN(key, "/", 3)
	if len(parts) != 3 {
		return "", "", "", fmt.Errorf("malformed group key %q", key)
	}
	return parts[0], parts[1], parts[2], nil
}

// jobSize is how many pods of a Job run at once: its parallelism, or
// fewer when fewer completions remain.
func jobSize(job *batchv1.Job) int {
	n := int32(1)
	if job.Spec.Parallelism != nil {
		n = *job.Spec.Parallelism
	}
	if job.Spec.Completions != nil {
		n = min(n, max(*job.Spec.Completions-job.Status.Succeeded, 0))
	}
	return int(n)
}

// jobSetSize adds up the sizes of a JobSet's child Jobs.
func jobSetSize(jobs []*batchv1.Job) int {
	n := 0
	for _, j := range jobs {
		if j.DeletionTimestamp == nil {
			n += jobSize(j)
		}
	}
	return n
}

func jobSetSelector(name string) labels.Selector {
	return labels.SelectorFromSet(labels.Set{labelJobSetName: name})
}

// lwsSize reads the replica group's size from its pods.
func lwsSize(pods []*v1.Pod) int {
	for _, p := range pods {
		if n, err := strconv.Atoi(p.Annotations[annotationLWSSize]); err == nil && n > 0 {
			return n
		}
	}
	return 0
}

// rankPods orders a group's pods the way its workload numbers them: JobSet
// job index, then completion index of an Indexed Job, then LeaderWorkerSet
// worker index, then name in natural order ("w-2" before "w-10"). The
// planner places pods in this order, so neighbours in rank end up close.
func rankPods(pods []*v1.Pod) {
	num := func(p *v1.Pod, label string) int {
		v, ok := p.Labels[label]
		if !ok {
			v, ok = p.Annotations[label]
		}
		if !ok {
			return -1
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			return -1
		}
		return n
	}
	slices.SortStableFunc(pods, func(a, b *v1.Pod) int {
		for _, l := range []string{labelJobSetJobIndex, batchv1.JobCompletionIndexAnnotation, labelLWSWorkerIndex} {
			if d := num(a, l) - num(b, l); d != 0 {
				return d
			}
		}
		switch {
		case topology.NaturalLess(a.Name, b.Name):
			return -1
		case topology.NaturalLess(b.Name, a.Name):
			return 1
		}
		return 0
	})
}

// foreignGates lists the pod's scheduling gates other than gputopo's: a
// queue (Kueue) or another admission controller holds the pod until it
// removes them.
func foreignGates(pod *v1.Pod) []string {
	var out []string
	for _, g := range pod.Spec.SchedulingGates {
		if g.Name != placement.SchedulingGate {
			out = append(out, g.Name)
		}
	}
	return out
}

func hasGate(pod *v1.Pod) bool {
	return slices.ContainsFunc(pod.Spec.SchedulingGates, func(g v1.PodSchedulingGate) bool { return g.Name == placement.SchedulingGate })
}

// active reports pods that still need or hold a place.
func active(pod *v1.Pod) bool {
	return pod.DeletionTimestamp == nil && !finished(pod)
}

// finished reports pods whose containers ended for good.
func finished(pod *v1.Pod) bool {
	return pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed
}
