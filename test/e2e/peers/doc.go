// Package peers runs gputopo beside the workload controllers its users
// run it with: the JobSet controller, the LeaderWorkerSet controller and
// Kueue, each the real manager built from the Go module proxy (`make
// peer-binaries`) and started by the harness with its CRDs and webhooks
// (test/cluster, Config.Peers). Its cluster has only fake nodes: what the
// tests check is where the peers' pods are bound and which devices their
// claims hold, and when.
package peers
