// Package simulate replays GPU traces offline through gputopo's planner
// and, side by side, through two schedulers without gputopo: a model of
// the default kube-scheduler (feasible nodes sampled as it samples them,
// LeastAllocated and BalancedAllocation over CPU and memory, ties broken
// at random by seed) and first fit over nodes in name order. All three
// decide device fits with the same structured allocator on the same
// ResourceSlices, which the kubelet plugin's slice generator renders from
// simulated GPU profiles, so the comparison isolates the placement policy.
//
// It is pure: no client-go, no API server. `gputopo simulate` is its CLI.
//
// Inputs:
//   - a cluster: a cluster topology (pkg/clustertopo, the files of
//     test/cluster/topologies) or the Alibaba GPU v2023 node list, with a
//     synthetic PCIe-only profile per GPU count and model, the nodes' CPU
//     and memory, and consecutive nodes grouped into leaves and spines;
//     with ClusterOptions.Sharing every GPU is published for sharing;
//   - a trace: the Alibaba pod lists (one-pod jobs, shares of a GPU and
//     pods without GPUs included), a simple job CSV with optional
//     arrivals and durations, or a generated Philly-like mix with
//     multi-node jobs;
//   - claims: a DeviceClass and two claim templates read from manifest
//     files, as a user's are (whole GPUs, a share of one).
//
// Static traces follow the FGD paper (Weng et al., ATC'23): jobs arrive in
// trace order or shuffled by seed until what they ask for reaches demand
// × the cluster's GPUs, counted in milli-GPUs, a short trace being
// inflated by sampling it with replacement; nothing departs; allocation is
// measured at the end. Timed traces replay arrivals and departures as
// events: a job that does not fit waits in arrival order, and every job
// that fits when GPUs free up starts (backfill); gputopo also keeps a
// multi-node job waiting until a domain of its size rule has room (see
// Options.MaxDomainWait). Jobs are all or nothing for every
// scheduler: the pod schedulers roll back a job whose pods do not all fit
// and count it as partial.
package simulate
