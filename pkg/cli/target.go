package cli

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
)

// LabelJobSetName is the label JobSet puts on the pods of its child Jobs.
const LabelJobSetName = "jobset.sigs.k8s.io/jobset-name"

// Target is what `explain` explains: a Job, a JobSet, a gputopo.dev/group
// or a pod, or, with no Kind, the Job of that name, else the group, else
// the pod.
type Target struct {
	Kind placement.GroupKind
	Name string
}

// TargetForms are the arguments explain accepts, for its help and errors.
const TargetForms = "NAME (a Job, else the pods with " + placement.AnnotationGroup + "=NAME, else a pod), " +
	"job/NAME (jobs, job.batch), jobset/NAME (jobsets, jobset.jobset.x-k8s.io), " +
	"group/NAME (the pods with " + placement.AnnotationGroup + "=NAME) or pod/NAME (pods, po)"

// targetKinds maps the TYPE of TYPE/NAME, as kubectl spells resources, to
// the kind of group.
var targetKinds = map[string]placement.GroupKind{
	"job": placement.GroupKindJob, "jobs": placement.GroupKindJob,
	"job.batch": placement.GroupKindJob, "jobs.batch": placement.GroupKindJob,
	"jobset": placement.GroupKindJobSet, "jobsets": placement.GroupKindJobSet,
	"jobset.jobset.x-k8s.io": placement.GroupKindJobSet, "jobsets.jobset.x-k8s.io": placement.GroupKindJobSet,
	"group": placement.GroupKindGroup, "groups": placement.GroupKindGroup,
	"pod": placement.GroupKindPod, "pods": placement.GroupKindPod, "po": placement.GroupKindPod,
}

// ParseTarget reads explain's argument: NAME or TYPE/NAME, as kubectl
// takes them.
func ParseTarget(arg string) (Target, error) {
	var t Target
	typ, name, typed := strings.Cut(arg, "/")
	if !typed {
		name = arg
	} else {
		kind, ok := targetKinds[strings.ToLower(typ)]
		if !ok {
			return Target{}, fmt.Errorf("cannot explain %q: %q is not a kind explain knows; use %s", arg, typ, TargetForms)
		}
		t.Kind = kind
	}
	if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
		return Target{}, fmt.Errorf("cannot explain %q: %q is not the name of an object (%s); use %s", arg, name, strings.Join(msgs, "; "), TargetForms)
	}
	t.Name = name
	return t, nil
}

// String is the target as kubectl names it: TYPE/NAME, or NAME.
func (t Target) String() string {
	if t.Kind == "" {
		return t.Name
	}
	return string(t.Kind) + "/" + t.Name
}
