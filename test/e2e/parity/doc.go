// Package parity is a differential test of gputopo's controller against
// kube-scheduler. A seeded generator makes cases, each a cluster state
// (DeviceTaintRules with and without a toleration in the claim, a node
// taint with and without one in the pods, a nodeSelector on a leaf, GPUs
// held by claims kube-scheduler allocated, another controller's scheduling
// gate, several namespaces, a topology spread constraint of one pod per
// node, a volume claim whose volume's node affinity allows all nodes but
// one or one leaf) and a workload (a Job of 1 to 4 pods with
// whole-node, NVLink-quad, one-GPU, shared-GPU, admin-access or
// unsatisfiable claims, or one user claim all its pods share). Each case
// runs twice on one cluster from the same state, through kube-scheduler
// alone and opted in to gputopo (gputopo.dev/placement: auto); both must
// place it or both refuse it, and neither may use a device the state
// rules out; with a spread constraint, no two pods share a node, with a
// volume no pod is on a node it leaves out, and with either no pod of the
// gputopo run is refused on its planned node (Released, Moved).
//
// `go test` runs 30 cases of seed 1 (TestParityShort); `make parity` runs
// 300 and prints the agreement by shape. GPUTOPO_PARITY_CASES,
// GPUTOPO_PARITY_SEED, GPUTOPO_PARITY_ONLY (case indexes) and
// GPUTOPO_PARITY_SHAPES (shapes, e.g. other-driver) choose the cases; a
// disagreement prints the values that run it again.
package parity
