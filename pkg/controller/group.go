package controller

import (
	"fmt"
	"slices"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/structured"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
)

// groupIndex indexes pods by their group key.
const groupIndex = "gputopo-group"

// groupKey says which group a pod belongs to: "ns/group/<name>" for the
// gputopo.dev/group annotation, "ns/job/<name>" for a Job's pods and
// "ns/pod/<name>" for a lone pod. ok is false for pods that did not opt in.
func groupKey(pod *v1.Pod) (key string, ok bool) {
	if !placement.OptedIn(pod.Annotations) {
		return "", false
	}
	if g := pod.Annotations[placement.AnnotationGroup]; g != "" {
		return pod.Namespace + "/group/" + g, true
	}
	if ref := metav1.GetControllerOf(pod); ref != nil && ref.Kind == "Job" {
		return pod.Namespace + "/job/" + ref.Name, true
	}
	return pod.Namespace + "/pod/" + pod.Name, true
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

// jobSize is how many pods of a Job run at once.
func jobSize(job *batchv1.Job) int {
	n := int32(1)
	if job.Spec.Parallelism != nil {
		n = *job.Spec.Parallelism
	}
	if job.Spec.Completions != nil && *job.Spec.Completions < n {
		n = *job.Spec.Completions
	}
	return int(n)
}

func hasGate(pod *v1.Pod) bool {
	return slices.ContainsFunc(pod.Spec.SchedulingGates, func(g v1.PodSchedulingGate) bool { return g.Name == placement.SchedulingGate })
}

// active reports pods that still need or hold a place.
func active(pod *v1.Pod) bool {
	return pod.DeletionTimestamp == nil && pod.Status.Phase != v1.PodSucceeded && pod.Status.Phase != v1.PodFailed
}

func encodeDevices(ids []structured.DeviceID) string {
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = id.String()
	}
	return strings.Join(parts, ",")
}

func decodeDevices(s string) []structured.DeviceID {
	var out []structured.DeviceID
	for _, p := range strings.Split(s, ",") {
		f := strings.Split(p, "/")
		if len(f) == 3 {
			out = append(out, structured.MakeDeviceID(f[0], f[1], f[2]))
		}
	}
	return out
}
