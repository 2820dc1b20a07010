// Package simulate replays GPU traces offline through gputopo's planner
// and, side by side, through a topology-oblivious baseline: the plain
// scheduler, first fit over nodes in name order, one pod at a time. Both
// decide fits with the same structured allocator on the same
// ResourceSlices, which the kubelet plugin's slice generator renders from
// simulated GPU profiles, so the comparison isolates the placement policy.
//
// It is pure: no client-go, no API server. `gputopo simulate` is its CLI.
//
// Inputs:
//   - a cluster: a YAML Topology (spines × leaves × nodes of sim profiles,
//     the shape of test/cluster/topologies) or the Alibaba GPU v2023 node
//     list, with a synthetic PCIe-only profile per GPU count and model and
//     consecutive nodes grouped into leaves and spines;
//   - a trace: the Alibaba pod lists (one-pod jobs; a share of one GPU is
//     rounded up to a whole GPU, as DRA claims of exact counts cannot
//     share), a simple job CSV with optional arrivals and durations, or a
//     generated Philly-like mix with multi-node jobs.
//
// Static traces follow the FGD paper (Weng et al., ATC'23): jobs arrive in
// trace order or shuffled by seed until the requested GPUs reach demand ×
// the cluster's GPUs, a short trace being inflated by sampling it with
// replacement; nothing departs; the allocation ratio is measured at the
// end. Timed traces replay arrivals and departures as events; a job that
// does not fit on arrival is refused, not queued.
//
// Each pod's claim is the demo's gpu-1 template with the count set to
// the pod's GPUs. Jobs are all or nothing for both schedulers: the
// baseline rolls back a job whose pods do not all fit and counts it as
// partial.
package simulate
