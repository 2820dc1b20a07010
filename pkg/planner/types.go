package planner

import (
	"fmt"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"

	placementapi "github.com/gputopo/gputopo/api/placement/v1alpha1"
)

// Placement, Strategy, Level and Domain are the placement API's types:
// the planner decides in the terms the controller records.
type (
	Placement = placementapi.Placement
	Strategy  = placementapi.Strategy
	Level     = placementapi.Level
	Domain    = placementapi.Domain
)

const (
	PlacementAuto           = placementapi.PlacementAuto
	PlacementSameLeaf       = placementapi.PlacementSameLeaf
	PlacementAdjacentLeaves = placementapi.PlacementAdjacentLeaves
	PlacementSameSpine      = placementapi.PlacementSameSpine
	PlacementNone           = placementapi.PlacementNone

	StrategyConsolidated = placementapi.StrategyConsolidated
	StrategyBalanced     = placementapi.StrategyBalanced
	StrategyDistributed  = placementapi.StrategyDistributed

	LevelNode    = placementapi.LevelNode
	LevelLeaf    = placementapi.LevelLeaf
	LevelLeaves  = placementapi.LevelLeaves
	LevelSpine   = placementapi.LevelSpine
	LevelCluster = placementapi.LevelCluster
)

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
	// OwnNodeAffinity is the pod's own node affinity, before a caller
	// narrowed NodeAffinity (to the nodes of allocated claims, off a node
	// that refused the pod): the nodes a topology spread constraint counts
	// follow it, as the scheduler sees the pod. Nil: NodeAffinity.
	OwnNodeAffinity *v1.NodeAffinity
	// Volumes are node selectors that must each match the node: where
	// the pod's PersistentVolumeClaims can be used, as kube-scheduler's
	// VolumeBinding and VolumeZone filters judge them (the controller's
	// volumes.go). Unlike NodeAffinity they are not joined into one
	// selector, whose terms would multiply.
	Volumes []*v1.NodeSelector
	// Tolerations must tolerate every NoSchedule and NoExecute taint of
	// the node, and the unschedulable taint of a cordoned node.
	Tolerations []v1.Toleration
	// Requests are the pod's effective requests (init containers,
	// pod-level resources and overhead included): what it takes from the
	// node's allocatable besides one pod slot.
	Requests v1.ResourceList
	// AntiAffinity are the pod's required pod anti-affinity terms, and
	// Members the pods it stands for (one, or the pods that share its
	// claims) as other pods' terms select them: the planner keeps the
	// job's pods apart as those terms ask (antiaffinity.go).
	AntiAffinity []v1.PodAffinityTerm
	Members      []Member
	// Affinity are the pod's required pod affinity terms: the planner
	// keeps the pod in a value of each term's key where a pod the term
	// selects is, or will be (podaffinity.go).
	Affinity []v1.PodAffinityTerm
	// Spread are the pod's topology spread constraints that must hold
	// (whenUnsatisfiable: DoNotSchedule): the planner keeps within each
	// what kube-scheduler's PodTopologySpread filter allows, whatever
	// order the pods bind in (spread.go).
	Spread []v1.TopologySpreadConstraint
	// HostPorts are the host ports the pod holds on its node: no two pods
	// holding the same one share a node (hostports.go).
	HostPorts []v1.ContainerPort
	// PortsClash says two of the pods it stands for (Members) ask for one
	// host port: they share its node, so one of them fits nowhere.
	PortsClash bool
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
	// PinnedPods are the pinned pods' anti-affinity terms and labels, by
	// the names in Pinned; a pinned pod missing here keeps no pod apart.
	PinnedPods map[string]Pod
	// Unbound names the pinned pods that are on their way to their nodes
	// (their gates opened for them), not bound yet.
	Unbound map[string]bool
	// Neighbours are pods outside the job, on their nodes, that required
	// pod anti-affinity or affinity may tie to its pods; the planner
	// keeps each pod out of the values of those its anti-affinity ties it
	// to (antiaffinity.go) and in the values of those its affinity
	// selects (podaffinity.go).
	Neighbours []Neighbour
	// Spread are the pods outside the job, on their nodes, that the
	// topology spread constraints of its pods may count: in a pod's
	// namespace, selected by a constraint's selector (spread.go).
	Spread []Neighbour
	// HostPortPods are the pods outside the job, on their nodes, that
	// hold host ports (Pod.HostPorts) its pods ask for.
	HostPortPods []Neighbour
	// Domain, when set, is the only domain the plan may use, e.g. the
	// domain of a placed group whose pod is being replaced.
	Domain *Domain
	// TopologyKeys are node-label keys the job's domain must lie within
	// one value of: the topology constraint of a kube-scheduler PodGroup
	// (scheduling.k8s.io), whose pod-group cycle tries one placement per
	// value of the key and refuses a gang that spans two. Nodes without
	// the label are ruled out (FilterTopologyKey), as the scheduler leaves
	// them out of every placement, and a domain whose nodes carry two
	// values of a key is never used.
	TopologyKeys []string
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
	// Widened is set when the job's fixed domain (Job.Domain, or the one
	// its pinned pods are in) could no longer hold it and the plan uses a
	// larger domain that holds the pinned pods.
	Widened bool
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
