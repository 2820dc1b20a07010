package planner

import (
	v1 "k8s.io/api/core/v1"
)

// Host ports. kube-scheduler's NodePorts filter refuses a pod a node where
// a pod already there (bound or assumed) holds one of the host ports the
// pod asks for: the same protocol and port, on the same host IP or with
// either IP the wildcard 0.0.0.0. Pods with hostNetwork ask for their
// container ports as host ports (the API server defaults them so). The
// planner keeps each pod off the nodes where a pod outside the job
// (Job.HostPortPods), a pinned pod or a pod of the job it placed before
// holds a port it asks for. The conflict rule is kube-scheduler's
// HostPortInfo.CheckConflict, restated here: the framework package that
// holds it brings client-go into the planner.

// wildcardIP is the host IP that binds every address.
const wildcardIP = "0.0.0.0"

// RequiredHostPorts are the host ports the pod holds on its node, as
// kube-scheduler counts them: those of its containers and of its init
// containers that run beside them (restartPolicy Always).
func RequiredHostPorts(pod *v1.Pod) []v1.ContainerPort {
	var out []v1.ContainerPort
	for _, c := range pod.Spec.InitContainers {
		if c.RestartPolicy == nil || *c.RestartPolicy != v1.ContainerRestartPolicyAlways {
			continue
		}
		out = appendHostPorts(out, c.Ports)
	}
	for _, c := range pod.Spec.Containers {
		out = appendHostPorts(out, c.Ports)
	}
	return out
}

func appendHostPorts(out []v1.ContainerPort, ports []v1.ContainerPort) []v1.ContainerPort {
	for _, p := range ports {
		if p.HostPort > 0 {
			out = append(out, p)
		}
	}
	return out
}

// portsConflict says whether two host ports cannot share a node.
func portsConflict(a, b v1.ContainerPort) bool {
	if a.HostPort <= 0 || a.HostPort != b.HostPort || protocolOf(a) != protocolOf(b) {
		return false
	}
	ia, ib := hostIPOf(a), hostIPOf(b)
	return ia == ib || ia == wildcardIP || ib == wildcardIP
}

func protocolOf(p v1.ContainerPort) v1.Protocol {
	if p.Protocol == "" {
		return v1.ProtocolTCP
	}
	return p.Protocol
}

func hostIPOf(p v1.ContainerPort) string {
	if p.HostIP == "" {
		return wildcardIP
	}
	return p.HostIP
}

// PortsConflict says whether a pod holding held keeps a pod asking for
// want off its node: a port of one conflicts with a port of the other.
func PortsConflict(want, held []v1.ContainerPort) bool {
	for _, w := range want {
		for _, h := range held {
			if portsConflict(w, h) {
				return true
			}
		}
	}
	return false
}

// findHostPorts fills st.portsHeld, by node, the host ports of the pods
// outside the job and the pinned pods; nil when no pod of the job asks for
// a host port.
func (st *state) findHostPorts() {
	job := st.job
	asks := false
	for _, p := range job.Pods {
		asks = asks || len(p.HostPorts) > 0
	}
	if !asks {
		return
	}
	st.portsHeld = map[int][]v1.ContainerPort{}
	for name, node := range job.Pinned {
		if n, ok := st.c.byName[node]; ok {
			st.portsHeld[n] = append(st.portsHeld[n], job.PinnedPods[name].HostPorts...)
		}
	}
	for _, nb := range job.HostPortPods {
		if n, ok := st.c.byName[nb.Node]; ok {
			st.portsHeld[n] = append(st.portsHeld[n], nb.Pod.HostPorts...)
		}
	}
	st.reasons = append(st.reasons, "the job's pods ask for host ports, which two pods cannot share on a node")
}

// keptByPorts says whether the pod may not go to node n: a pod there, or
// one of the job's placed there in the attempt, holds a port it asks for.
func (a *attempt) keptByPorts(pod, n int) bool {
	st := a.st
	want := st.job.Pods[pod].HostPorts
	if st.portsHeld == nil || len(want) == 0 {
		return false
	}
	if st.job.Pods[pod].PortsClash {
		return true
	}
	if PortsConflict(want, st.portsHeld[n]) {
		return true
	}
	for other, m := range a.assign {
		if m == n && other != pod && PortsConflict(want, st.job.Pods[other].HostPorts) {
			return true
		}
	}
	return false
}
