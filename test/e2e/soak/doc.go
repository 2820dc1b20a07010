// Package soak is a fault soak of gputopo on the local cluster: for a set
// time (GPUTOPO_SOAK_DURATION) a seeded generator (GPUTOPO_SOAK_SEED)
// creates and deletes a random workload in several namespaces (opted-in
// Jobs of 1 to 4 pods with whole-node, NVLink, one-GPU and shared-GPU claim
// templates, single opted-in pods, user ResourceClaims that a Job's pods
// share, plain GPU pods), while faults hit the cluster at random intervals:
// a Node object deleted, a kubelet stopped and its node NotReady, a kubelet
// plugin, the controller, kube-scheduler or kube-apiserver restarted.
//
// Every second the invariants are checked on what the API server serves
// (invariants_test.go): no device in two allocated claims beyond what
// sharing allows, no allocated claim without a live consumer for more than
// a minute, no opted-in pod left waiting past the controller's bind timeout
// plus 30 s while gputopo's own planner, asked on the live state, finds its
// group a place; and at the end, once the workload is deleted, nothing
// allocated. The first breach fails the run with what was seen.
//
// `make soak` runs it (20 minutes by default); without
// GPUTOPO_SOAK_DURATION no cluster starts and only the checkers' own tests
// run.
package soak
