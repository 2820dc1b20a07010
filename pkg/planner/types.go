package planner

import (
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
)

// Placement says how close together a job's pods must be.
type Placement string

const (
	// PlacementAuto picks the smallest subtree that holds the job.
	PlacementAuto Placement = "auto"
	// PlacementSameLeaf requires every pod under one leaf switch.
	PlacementSameLeaf Placement = "same-leaf"
	// PlacementAdjacentLeaves requires a run of adjacent leaves under one
	// spine (a single leaf is the shortest run).
	PlacementAdjacentLeaves Placement = "adjacent-leaves"
	// PlacementSameSpine requires every pod under one spine.
	PlacementSameSpine Placement = "same-spine"
	// PlacementNone places pods like the plain scheduler: anywhere, first
	// fit in strategy order.
	PlacementNone Placement = "none"
)

// Strategy says how pods spread over the nodes of the chosen domain.
type Strategy string

const (
	// StrategyConsolidated packs pods onto as few nodes as possible, the
	// fullest nodes first.
	StrategyConsolidated Strategy = "consolidated"
	// StrategyBalanced spreads pods evenly over the domain's nodes, filling
	// nodes that are already partly used before empty ones. The default.
	StrategyBalanced Strategy = "balanced"
	// StrategyDistributed puts one pod per node where possible and spreads
	// pods across the domain's leaves.
	StrategyDistributed Strategy = "distributed"
)

// Level is the size of a domain.
type Level string

const (
	LevelNode   Level = "node"
	LevelLeaf   Level = "leaf"
	LevelLeaves Level = "leaves" // a run of adjacent leaves under one spine
	LevelSpine  Level = "spine"
	// LevelCluster spans spines: Names lists them, or is empty for the
	// whole cluster (which also holds nodes without network labels).
	LevelCluster Level = "cluster"
)

// Domain is a subtree of the cluster. Names are node, leaf or spine names
// according to Level, in topology order.
type Domain struct {
	Level Level
	Names []string
}

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

// Pod is one pod of a job with its ResourceClaims, already instantiated
// from templates and not yet allocated, and the parts of its spec that
// decide which nodes it may use. PodFor fills it from a v1.Pod.
type Pod struct {
	Name   string
	Claims []*resourceapi.ResourceClaim
	// NodeSelector and NodeAffinity (only its required terms) must match
	// the node's labels, as kube-scheduler's NodeAffinity filter checks.
	NodeSelector map[string]string
	NodeAffinity *v1.NodeAffinity
	// Tolerations must tolerate every NoSchedule and NoExecute taint of
	// the node, and the unschedulable taint of a cordoned node.
	Tolerations []v1.Toleration
	// Requests are the pod's effective requests (init containers,
	// pod-level resources and overhead included): what it takes from the
	// node's allocatable besides one pod slot.
	Requests v1.ResourceList
}

// Job is a group of pods placed together.
type Job struct {
	// Key identifies the job, e.g. namespace/name; it keys Reservations.
	Key       string
	Pods      []Pod
	Placement Placement // empty means auto
	Strategy  Strategy  // empty means balanced
	// PreferredDomain names a leaf or a spine. It is tried first at every
	// size; when it cannot hold the job the plan falls back to another
	// domain (Plan.Fallback) unless PreferredRequired.
	PreferredDomain   string
	PreferredRequired bool
	// Pinned maps pods of the job that are already bound to their nodes.
	// They are not planned again; their devices must already be in the
	// Snapshot. They keep the group together: without Domain, the new pods
	// must go into the smallest domain that holds the pinned nodes.
	Pinned map[string]string
	// Domain, when set, is the only domain the plan may use, e.g. the
	// domain of a placed group whose pod is being replaced.
	Domain *Domain
}

// Plan is where a job goes.
type Plan struct {
	Job    string
	Domain Domain
	// Assignments maps each planned pod to its node.
	Assignments map[string]string
	// Allocations maps each planned pod to one allocation result per claim,
	// in the order of Pod.Claims: the devices the plan holds for it.
	Allocations map[string][]resourceapi.AllocationResult
	// Requests sums, per node, what the planned pods take from its
	// allocatable: their requests and one pod slot each.
	Requests NodeUsage
	// Reasons explain the decision, one line each, for events and
	// `gputopo explain`.
	Reasons []string
	// Fallback is set when the preferred domain could not be used.
	Fallback bool
	// AllocatorRuns counts the allocator calls the plan took, the final
	// check of every pod included: a measure of planning cost.
	AllocatorRuns int
}

// Unschedulable is returned when no allowed domain can hold the job right
// now. Reason and Best are written for a person; BestDomain and BestPods
// are the same facts for code.
type Unschedulable struct {
	Job    string
	Reason string
	// Best describes the candidate that came closest, empty when none
	// could hold a single pod.
	Best       string
	BestDomain Domain
	BestPods   int
	// Details holds one line per size that was tried.
	Details []string
	// Filtered counts the nodes that the job's pods cannot use at all,
	// whatever their devices, by the filter that ruled each out.
	Filtered []FilteredNodes
}

func (e *Unschedulable) Error() string {
	msg := fmt.Sprintf("job %s: %s", e.Job, e.Reason)
	if e.Best != "" {
		msg += "; best: " + e.Best
	}
	if len(e.Filtered) > 0 {
		msg += "; " + filteredSentence(e.Filtered)
	}
	return msg
}

// BrokenClaimError means a pod's claims cannot be evaluated at all (a CEL
// compile or runtime error, an unknown DeviceClass): fixing the claim, not
// waiting for capacity, is what helps.
type BrokenClaimError struct {
	Job, Pod, Node string
	Err            error
}

func (e *BrokenClaimError) Error() string {
	return fmt.Sprintf("job %s: claims of pod %s cannot be evaluated on node %s: %v", e.Job, e.Pod, e.Node, e.Err)
}

func (e *BrokenClaimError) Unwrap() error { return e.Err }

// InvalidJobError means the job itself is malformed.
type InvalidJobError struct {
	Job, Reason string
}

func (e *InvalidJobError) Error() string { return fmt.Sprintf("invalid job %s: %s", e.Job, e.Reason) }
