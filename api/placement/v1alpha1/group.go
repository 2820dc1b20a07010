package v1alpha1

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// GroupKind says what forms a group of pods that are placed together.
type GroupKind string

const (
	// GroupKindJob: the pods of one Job.
	GroupKindJob GroupKind = "job"
	// GroupKindJobSet: the pods of every child Job of one JobSet.
	GroupKindJobSet GroupKind = "jobset"
	// GroupKindLWS: one replica group of a LeaderWorkerSet, named as its
	// leader pod (<LeaderWorkerSet>-<group index>).
	GroupKindLWS GroupKind = "lws"
	// GroupKindGroup: the pods that name the group in AnnotationGroup.
	GroupKindGroup GroupKind = "group"
	// GroupKindPod: a pod that belongs to no group, placed alone.
	GroupKindPod GroupKind = "pod"
)

// GroupKinds lists the kinds in documentation order.
var GroupKinds = []GroupKind{GroupKindJob, GroupKindJobSet, GroupKindLWS, GroupKindGroup, GroupKindPod}

// GroupKey names a group of pods: its namespace, kind and name. It is the
// controller's work item and the value of AnnotationAllocatedBy.
type GroupKey struct {
	Namespace string
	Kind      GroupKind
	Name      string
}

const groupKeyForm = "<namespace>/<kind>/<name>, such as default/job/train, with a kind of job, jobset, lws, group or pod"

// Format writes the key as "<namespace>/<kind>/<name>".
func (k GroupKey) Format() string {
	return k.Namespace + "/" + string(k.Kind) + "/" + k.Name
}

// String is Format, for logs.
func (k GroupKey) String() string { return k.Format() }

// Validate checks the kind, that the namespace is a DNS label and that the
// name is a DNS subdomain, as the objects the key comes from must be.
func (k GroupKey) Validate() error {
	if p := k.problem(); p != "" {
		return &ValueError{Key: "group key", Value: k.Format(), Problem: p, Want: groupKeyForm}
	}
	return nil
}

func (k GroupKey) problem() string {
	if !slices.Contains(GroupKinds, k.Kind) {
		return fmt.Sprintf("has the unknown kind %q", k.Kind)
	}
	if msgs := validation.IsDNS1123Label(k.Namespace); len(msgs) > 0 {
		return fmt.Sprintf("has the bad namespace %q: %s", k.Namespace, strings.Join(msgs, "; "))
	}
	if msgs := validation.IsDNS1123Subdomain(k.Name); len(msgs) > 0 {
		return fmt.Sprintf("has the bad name %q: %s", k.Name, strings.Join(msgs, "; "))
	}
	return ""
}

// ParseGroupKey reads what GroupKey.Format writes.
func ParseGroupKey(s string) (GroupKey, error) {
	return parseGroupKey("group key", s)
}

// ParseAllocatedBy reads AnnotationAllocatedBy: the key of the group a
// claim was allocated for.
func ParseAllocatedBy(s string) (GroupKey, error) {
	return parseGroupKey(AnnotationAllocatedBy, s)
}

func parseGroupKey(where, s string) (GroupKey, error) {
	parts := strings.Split(s, "/")
	if len(parts) != 3 {
		return GroupKey{}, &ValueError{Key: where, Value: s, Problem: fmt.Sprintf("has %d parts separated by \"/\", not 3", len(parts)), Want: groupKeyForm}
	}
	k := GroupKey{Namespace: parts[0], Kind: GroupKind(parts[1]), Name: parts[2]}
	if p := k.problem(); p != "" {
		return GroupKey{}, &ValueError{Key: where, Value: s, Problem: p, Want: groupKeyForm}
	}
	return k, nil
}
