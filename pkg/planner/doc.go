// Package planner decides where a multi-pod GPU job goes: which leaf, run of
// adjacent leaves or spine, and which node each pod lands on. It is pure: it
// imports no client-go and keeps no state between calls, so the controller,
// the CLI's `explain` and the trace simulator all run the same code.
//
// The shape follows Kueue's topology-aware scheduling:
//
//   - A Cluster is the static tree (spines → leaves → nodes, with each
//     node's ResourceSlices). It is built once per node generation and shared
//     read-only.
//   - A Snapshot is one cycle's view of what is allocated. Reservations are
//     the devices other jobs' plans hold while their pods are still gated.
//     A plan never mutates either, so plans can run concurrently.
//   - Planner.Plan returns a Plan, or an error a person can act on:
//     *Unschedulable (with the best candidate), *BrokenClaimError (a claim
//     that no node can evaluate, e.g. a CEL error) or *InvalidJobError.
//
// "Fits" means exactly what kube-scheduler accepts: every (pod, node) pair is
// decided by k8s.io/dynamic-resource-allocation/structured through
// devicefit.Evaluator, and the pods of a job that share a node are allocated
// one after the other on top of each other's results. Counting free devices
// only prunes; it never decides that something fits.
//
// A pod may only use nodes kube-scheduler would bind it to: Ready, not
// cordoned, without a NoSchedule or NoExecute taint it does not tolerate,
// matching its nodeSelector and required node affinity, and with room in
// the node's allocatable (cpu, memory, pod slots, any other resource)
// after the pods already there (Snapshot, WithUsed), other plans'
// reservations and the plan's own pods. These filters bound the same
// per-node counts as the devices do, and a refusal says how many nodes
// each filter ruled out.
//
// Choosing a domain:
//
//  1. Size: the smallest subtree that can hold the job — one node for one
//     pod, one leaf, then runs of 2, 3, ... adjacent leaves under one spine,
//     then runs of adjacent spines and finally the whole cluster. The
//     placement mode (same-leaf, adjacent-leaves, same-spine, none) limits
//     which of these are allowed.
//  2. Preference: at each size the preferred leaf or spine is tried first;
//     locality wins over preference, so a job that fits in a leaf goes to
//     another leaf rather than to a pair of leaves around the preferred one.
//  3. Best fit: among the domains of that size that fit, the one with the
//     fewest free GPUs left after placement, so whole leaves and whole nodes
//     stay free for big jobs; ties go to the smaller name.
//  4. Strategy: inside the domain, consolidated, balanced or distributed
//     decides the node of each pod.
//  5. Preference ladders (firstAvailable requests) come before best fit and
//     strategy: among domains of one size the one whose pods get the
//     earliest subrequests wins, and inside it each pod goes to the node
//     giving its claims the earliest ones. Jobs without ladders, or whose
//     first choices fit, are planned exactly as without this rule.
//
// A job of one pod whose claims ask only for GPUs (whole ones, or a share
// of one shared GPU) with placement auto skips the domain search: it goes
// to the node and GPU that fragment the cluster's free GPU capacity least
// for the expected workload (FGD; places of nearly equal rise count as
// equal, FGD's integer score for a pod with GPUs, and the pod packs
// among them, nodes in use first), or to the fullest
// (consolidated) or emptiest (distributed) place that fits; see fgd.go.
// Shares held by allocated claims and reservations count
// (NewSnapshotFromState, Reservation.Shares); several jobs may hold
// shares of one device.
//
// Pods are placed greedily (largest first). For jobs whose pods all have the
// same claims, which is the common case, that is exact: the domain fits if
// and only if the nodes' capacities for the pod add up. For mixed jobs the
// greedy placement can miss a packing that exists.
package planner
