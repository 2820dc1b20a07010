package v1alpha1

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/util/validation"
)

// The controller's decision is recorded in annotations whose values have
// one written form each. Every value type here has Format, which writes
// that form, Validate, and a Parse function that accepts exactly what
// Format writes for a valid value: Parse(v.Format()) == v, and a string
// that parses is the string Format writes back.

// ValueError is a malformed value of a controller-written annotation or of
// a group key: where it was, the value, what is wrong with it and the form
// the controller writes.
type ValueError struct {
	// Key is the annotation, or "group key" for a key that is no
	// annotation's value.
	Key     string
	Value   string
	Problem string
	Want    string
}

func (e *ValueError) Error() string {
	return fmt.Sprintf("%s: %q %s; want %s", e.Key, e.Value, e.Problem, e.Want)
}

// Level is the size of a domain.
type Level string

const (
	LevelNode Level = "node"
	LevelLeaf Level = "leaf"
	// LevelLeaves is a run of two or more adjacent leaves under one spine.
	LevelLeaves Level = "leaves"
	LevelSpine  Level = "spine"
	// LevelCluster spans spines: Names lists two or more of them, or is
	// empty for the whole cluster (which also holds nodes without network
	// labels).
	LevelCluster Level = "cluster"
)

// Domain is a subtree of the cluster. Names are node, leaf or spine names
// according to Level, in topology order.
type Domain struct {
	Level Level
	Names []string
}

const domainForm = "<level>:<names>, one of node:<node>, leaf:<leaf>, leaves:<leaf>,<leaf>[,...], " +
	"spine:<spine>, cluster:<spine>,<spine>[,...] or cluster: for the whole cluster"

// String reads as a phrase: "leaf leaf-1", "leaves leaf-2,leaf-3",
// "the whole cluster".
func (d Domain) String() string {
	if d.Level == LevelCluster && len(d.Names) == 0 {
		return "the whole cluster"
	}
	if d.Level == LevelCluster {
		return "spines " + strings.Join(d.Names, ",")
	}
	return string(d.Level) + " " + strings.Join(d.Names, ",")
}

// Format writes the domain as AnnotationDomain holds it: the level, a
// colon and the names separated by commas, such as "leaf:leaf-2",
// "leaves:leaf-2,leaf-3", "spine:spine-0", "node:gpu-1", or "cluster:" for
// the whole cluster.
func (d Domain) Format() string {
	return string(d.Level) + ":" + strings.Join(d.Names, ",")
}

// Validate checks the level and the number and form of the names. Node
// names are DNS subdomains; leaf and spine names are label values, as in
// the node labels they come from.
func (d Domain) Validate() error {
	if p := d.problem(); p != "" {
		return &ValueError{Key: AnnotationDomain, Value: d.Format(), Problem: p, Want: domainForm}
	}
	return nil
}

// ParseDomain reads what Domain.Format writes.
func ParseDomain(s string) (Domain, error) {
	level, names, ok := strings.Cut(s, ":")
	if !ok {
		return Domain{}, &ValueError{Key: AnnotationDomain, Value: s, Problem: "has no colon after the level", Want: domainForm}
	}
	d := Domain{Level: Level(level)}
	if names != "" {
		d.Names = strings.Split(names, ",")
	}
	if p := d.problem(); p != "" {
		return Domain{}, &ValueError{Key: AnnotationDomain, Value: s, Problem: p, Want: domainForm}
	}
	return d, nil
}

func (d Domain) problem() string {
	switch d.Level {
	case LevelNode, LevelLeaf, LevelSpine:
		if len(d.Names) != 1 {
			return fmt.Sprintf("has %d names; %s takes exactly one", len(d.Names), d.Level)
		}
	case LevelLeaves:
		if len(d.Names) < 2 {
			return fmt.Sprintf("has %d names; leaves takes two or more (one leaf is leaf:<leaf>)", len(d.Names))
		}
	case LevelCluster:
		if len(d.Names) == 1 {
			return "has one name; cluster takes none (the whole cluster) or two or more spines (one spine is spine:<spine>)"
		}
	case "":
		return "has no level"
	default:
		return fmt.Sprintf("has the unknown level %q", d.Level)
	}
	seen := make(map[string]bool, len(d.Names))
	for _, n := range d.Names {
		var msgs []string
		switch {
		case n == "":
			msgs = []string{"must not be empty"}
		case d.Level == LevelNode:
			msgs = validation.IsDNS1123Subdomain(n)
		default:
			msgs = validation.IsValidLabelValue(n)
		}
		if len(msgs) > 0 {
			return fmt.Sprintf("has the bad name %q: %s", n, strings.Join(msgs, "; "))
		}
		if seen[n] {
			return fmt.Sprintf("names %q twice", n)
		}
		seen[n] = true
	}
	return ""
}

// ParseNode reads AnnotationNode: a node name.
func ParseNode(s string) (string, error) {
	if msgs := validation.IsDNS1123Subdomain(s); len(msgs) > 0 {
		return "", &ValueError{Key: AnnotationNode, Value: s, Problem: "is not a node name: " + strings.Join(msgs, "; "), Want: "the name of a node"}
	}
	return s, nil
}

// reasonRE is the form of a status or release reason: one UpperCamelCase
// word, like an Event's reason.
var reasonRE = regexp.MustCompile(`^[A-Z][A-Za-z0-9]{0,63}$`)

// Status is why a group waits, written on each of its waiting pods.
type Status struct {
	// Reason is one UpperCamelCase word for code, such as the Status*
	// constants.
	Reason string
	// Message explains it to a person. Format cuts it to MaxStatusMessage
	// bytes.
	Message string
}

// Status reasons the controller writes.
const (
	// StatusWaitingForPods: not every pod of the group exists yet.
	StatusWaitingForPods = "WaitingForPods"
	// StatusUnschedulable: no allowed domain holds the group now.
	StatusUnschedulable = "Unschedulable"
	// StatusInvalidPlacement: the placement annotations are malformed.
	StatusInvalidPlacement = "InvalidPlacement"
	// StatusInvalidClaim: a claim of the group cannot be evaluated.
	StatusInvalidClaim = "InvalidClaim"
	// StatusWaitingForGates: another controller's scheduling gate (a
	// queue's, such as Kueue's) still holds pods of the group; gputopo
	// plans it once its own gate is the last one.
	StatusWaitingForGates = "WaitingForGates"
	// StatusWaitingForPodGroup: the group's pods name a kube-scheduler
	// PodGroup (spec.schedulingGroup) that does not exist yet; its gang
	// size and topology constraint are part of the plan.
	StatusWaitingForPodGroup = "WaitingForPodGroup"
	// StatusWaitingForVolumes: a pod's PersistentVolumeClaims keep it off
	// every node for now (missing, not bound while their binding is
	// immediate, or with no volume to bind and none to provision), as
	// kube-scheduler's VolumeBinding filter leaves it pending.
	StatusWaitingForVolumes = "WaitingForVolumes"
)

// WaitingForPodsMessage is the message of StatusWaitingForPods. The
// scheduling-gate admission policy writes that status on every pod it
// gates, as it is created (AdmittedStatus), so the controller writes it
// only on pods gated some other way.
const WaitingForPodsMessage = "waiting for the group's pods and their ResourceClaims to exist"

// AdmittedStatus is the status a gated pod is created with.
var AdmittedStatus = Status{Reason: StatusWaitingForPods, Message: WaitingForPodsMessage}.Format()

// MaxStatusMessage bounds a status message in bytes.
const MaxStatusMessage = 1000

const statusForm = "<Reason>: <message>, such as \"Unschedulable: no leaf can hold 5 pods\", with an UpperCamelCase reason"

// Format writes the status as AnnotationStatus holds it: "<Reason>:
// <message>". A message longer than MaxStatusMessage bytes is cut and ends
// in "...".
func (s Status) Format() string {
	return s.Reason + ": " + truncate(s.Message, MaxStatusMessage)
}

// Validate checks the reason's form and that there is a message.
func (s Status) Validate() error {
	if p := s.problem(); p != "" {
		return &ValueError{Key: AnnotationStatus, Value: s.Format(), Problem: p, Want: statusForm}
	}
	return nil
}

func (s Status) problem() string {
	switch {
	case !reasonRE.MatchString(s.Reason):
		return fmt.Sprintf("has the reason %q, which is not one UpperCamelCase word of at most 64 characters", s.Reason)
	case s.Message == "":
		return "has no message"
	case len(s.Message) > MaxStatusMessage:
		return fmt.Sprintf("has a message of %d bytes, more than %d", len(s.Message), MaxStatusMessage)
	}
	return ""
}

// ParseStatus reads what Status.Format writes.
func ParseStatus(v string) (Status, error) {
	reason, msg, ok := strings.Cut(v, ": ")
	if !ok {
		return Status{}, &ValueError{Key: AnnotationStatus, Value: v, Problem: "has no \": \" after the reason", Want: statusForm}
	}
	s := Status{Reason: reason, Message: msg}
	if p := s.problem(); p != "" {
		return Status{}, &ValueError{Key: AnnotationStatus, Value: v, Problem: p, Want: statusForm}
	}
	return s, nil
}

// truncate cuts s to at most limit bytes, on a rune boundary, ending in
// "..." when it cut.
func truncate(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	cut := limit - len("...")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// Release says that a pod's group was released and planned again: how
// often, and why the last time.
type Release struct {
	// Count is how many times the group was released, 1 or more.
	Count int
	// Reason is one UpperCamelCase word, such as the Release* constants.
	Reason string
}

// Release reasons the controller writes.
const (
	// ReleaseBindTimeout: not every pod of the group was bound in time.
	ReleaseBindTimeout = "BindTimeout"
	// ReleaseNodeNotReady: a node of the plan is not Ready.
	ReleaseNodeNotReady = "NodeNotReady"
	// ReleaseNodeTainted: a node of the plan has a NoExecute taint the pod
	// does not tolerate.
	ReleaseNodeTainted = "NodeTainted"
	// ReleaseNodeDeleted: a node of the plan was deleted.
	ReleaseNodeDeleted = "NodeDeleted"
	// ReleaseUnschedulable: the scheduler took back the claims of a pod
	// whose gate was open, as it could not place the pod where they were.
	ReleaseUnschedulable = "Unschedulable"
	// ReleaseDeviceConflict: a device of the plan was allocated to another
	// claim.
	ReleaseDeviceConflict = "DeviceConflict"
	// ReleaseForeignGate: another controller's scheduling gate holds the
	// pod, which may hold no devices until that gate is removed.
	ReleaseForeignGate = "ForeignGate"
	// ReleaseDomainFull: the group's domain could not hold its new pods
	// (it grew, or lost a node); the pod had not started and is planned
	// again with them.
	ReleaseDomainFull = "DomainFull"
)

const releaseForm = "<count>;<Reason>, such as \"2;NodeNotReady\", with a count from 1 and an UpperCamelCase reason"

// Format writes the release as AnnotationReleased holds it:
// "<count>;<Reason>".
func (r Release) Format() string {
	return strconv.Itoa(r.Count) + ";" + r.Reason
}

// Next is the record after one more release, for reason.
func (r Release) Next(reason string) Release {
	return Release{Count: r.Count + 1, Reason: reason}
}

// Validate checks the count and the reason's form.
func (r Release) Validate() error {
	if p := r.problem(); p != "" {
		return &ValueError{Key: AnnotationReleased, Value: r.Format(), Problem: p, Want: releaseForm}
	}
	return nil
}

func (r Release) problem() string {
	switch {
	case r.Count < 1 || r.Count > math.MaxInt32:
		return fmt.Sprintf("has the count %d, not a whole number from 1 to %d", r.Count, math.MaxInt32)
	case !reasonRE.MatchString(r.Reason):
		return fmt.Sprintf("has the reason %q, which is not one UpperCamelCase word of at most 64 characters", r.Reason)
	}
	return ""
}

// ParseRelease reads what Release.Format writes.
func ParseRelease(v string) (Release, error) {
	count, reason, ok := strings.Cut(v, ";")
	if !ok {
		return Release{}, &ValueError{Key: AnnotationReleased, Value: v, Problem: "has no \";\" after the count", Want: releaseForm}
	}
	n, err := strconv.Atoi(count)
	if err != nil || strconv.Itoa(n) != count {
		return Release{}, &ValueError{Key: AnnotationReleased, Value: v, Problem: fmt.Sprintf("has the count %q, not a whole number", count), Want: releaseForm}
	}
	r := Release{Count: n, Reason: reason}
	if p := r.problem(); p != "" {
		return Release{}, &ValueError{Key: AnnotationReleased, Value: v, Problem: p, Want: releaseForm}
	}
	return r, nil
}
