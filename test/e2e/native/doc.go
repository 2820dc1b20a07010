// Package native tests gputopo beside Kubernetes 1.37's workload-aware
// scheduling on a cluster with the workload gates on (GenericWorkload,
// WorkloadWithJob, TopologyAwareWorkloadScheduling): Jobs with
// spec.scheduling (a gang and a topology key), their PodGroups, groups
// whose devices kube-scheduler allocates in the domain gputopo chose, and
// the real JobSet controller (built by `localcluster build-peers --peers
// jobset`) beside a native gang.
package native
