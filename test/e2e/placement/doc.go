// Package placement is the end-to-end suite of the gputopo controller. It
// starts its own local cluster (testdata/topology.yaml: 2 spines × 4 leaves
// × 4 dgx-h100 nodes, two of them real), with the admission policies of
// deployments/admission and bin/gputopo-controller, and submits Jobs whose
// pod template carries gputopo.dev/placement, as a user would. It checks
// where the controller puts them (one leaf, a complete leaf, adjacent
// leaves), that a Job that does not fit stays gated and says why, that
// concurrent Jobs and replacement pods keep their domains, that a
// controller crash loses nothing, that bad annotations are refused at
// admission, that a placed Job really runs on real nodes, and the
// controller's metrics.
//
// TestContention (contention_test.go) submits ungated pods and gated Jobs
// of every shape at the same instant, deletes one node and taints another
// NoExecute while they are planned and kills the controller between claim
// writes; a watch checks every ResourceClaim event for a device held by
// two claims (ledger_test.go), every Job that fits must be bound in its
// domain within 6 minutes, the one too big stays gated and says why, and
// nothing stays allocated once the pods are gone. It logs each Job's time
// from creation to all pods bound. The node and the taint are restored,
// so the tests after it find the whole cluster.
//
// Run it with `make e2e` (together with the kubelet plugin suite in
// test/e2e), or alone:
//
//	make build && cd test/e2e && GPUTOPO_BIN=$PWD/../../bin go test -count=1 -v -timeout 30m ./placement
//
// On a failure the cluster directory is kept and printed; the controller's
// log is DIR/logs/controller.log. GPUTOPO_E2E_KEEP=1 keeps it after a pass.
package placement
