package simulate

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/planner"
	"github.com/gputopo/gputopo/pkg/topology"
)

// Nodes of a cluster file that do not say what they have are scored as
// if they had this much CPU and memory; nothing is refused for lack of it.
const (
	unknownCPUMilli  = 128_000
	unknownMemoryMiB = 1 << 20
)

// The default scheduler scores a pod without requests as if it asked for
// this much (kube-scheduler's non-zero defaults).
const (
	defaultCPUMilli  = 100
	defaultMemoryMiB = 200
)

// ledger is what one scheduler holds, node by node: devices and shares
// the way the allocator counts them, free compute per GPU for a quick
// first look, and CPU and memory. It mirrors what it holds into planner
// reservations so every scheduler is measured the same way.
type ledger struct {
	c        *Cluster
	state    []devicefit.State
	free     [][]int // milliGPU free per GPU index, by node
	shared   [][]bool
	cpu, mem []int64 // requested, by node
	held     map[string][]hold
	snap     *planner.Snapshot
	res      *planner.Reservations
}

// hold is what one pod of a job holds on its node.
type hold struct {
	node     int
	results  []resourceapi.AllocationResult
	cpu, mem int64
}

func newLedger(c *Cluster) *ledger {
	l := &ledger{c: c, held: map[string][]hold{}, snap: planner.NewSnapshot(c.Planner, nil), res: planner.NewReservations(),
		cpu: make([]int64, len(c.Nodes)), mem: make([]int64, len(c.Nodes))}
	for _, n := range c.Nodes {
		l.state = append(l.state, devicefit.NewState())
		free := make([]int, n.GPUs)
		shared := make([]bool, n.GPUs)
		for _, sl := range n.Slices {
			for _, d := range sl.Spec.Devices {
				if i, ok := gpuIndex(d.Name); ok && i < n.GPUs {
					free[i] = topology.MilliPerGPU
					shared[i] = d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations
				}
			}
		}
		l.free = append(l.free, free)
		l.shared = append(l.shared, shared)
	}
	return l
}

func gpuIndex(device string) (int, bool) {
	i, err := strconv.Atoi(strings.TrimPrefix(device, "gpu-"))
	return i, err == nil && strings.HasPrefix(device, "gpu-")
}

// roomFor says whether node n may hold a pod of j, counting GPUs, CPU and
// memory; the allocator has the last word on GPUs.
func (l *ledger) roomFor(n int, j Job, share int) bool {
	if !l.hasCPU(n, j) || !modelFits(&l.c.Nodes[n], j) {
		return false
	}
	if share > 0 {
		for i, f := range l.free[n] {
			if l.shared[n][i] && f >= share {
				return true
			}
		}
		return false
	}
	whole := 0
	for _, f := range l.free[n] {
		if f == topology.MilliPerGPU {
			whole++
		}
	}
	return whole >= j.GPUsPerPod
}

// modelFits says whether the node has a GPU model the job may use.
func modelFits(n *SimNode, j Job) bool {
	return len(j.GPUModels) == 0 || slices.Contains(j.GPUModels, n.Model)
}

func (l *ledger) hasCPU(n int, j Job) bool {
	nd := &l.c.Nodes[n]
	return (nd.CPUMilli == 0 || l.cpu[n]+j.CPUMilli <= nd.CPUMilli) && (nd.MemoryMiB == 0 || l.mem[n]+j.MemoryMiB <= nd.MemoryMiB)
}

// requests is what a pod asking cpu milli-CPUs and mem MiB takes from
// its node's allocatable, as the planner counts it; nil for nothing.
func requests(cpu, mem int64) v1.ResourceList {
	if cpu <= 0 && mem <= 0 {
		return nil
	}
	l := v1.ResourceList{}
	if cpu > 0 {
		l[v1.ResourceCPU] = *resource.NewMilliQuantity(cpu, resource.DecimalSI)
	}
	if mem > 0 {
		l[v1.ResourceMemory] = *resource.NewQuantity(mem<<20, resource.BinarySI)
	}
	return l
}

// allocate runs the allocator for one pod's claims on node n; on device
// alone of node n's devices when device is not empty.
func (l *ledger) allocate(ctx context.Context, eval *devicefit.Evaluator, n int, claims []*resourceapi.ResourceClaim, device string) ([]resourceapi.AllocationResult, error) {
	nd := &l.c.Nodes[n]
	sl := nd.Slices
	if device != "" {
		sl = planner.OnlyDevice(sl, device)
	}
	results, err := eval.AllocateOn(ctx, nd.Obj, sl, l.state[n].Allocator(), claims)
	if err != nil {
		return nil, fmt.Errorf("allocate on node %s: %w", nd.Name, err)
	}
	return results, nil
}

func (l *ledger) take(h hold) {
	l.state[h.node].Add(h.results...)
	l.cpu[h.node] += h.cpu
	l.mem[h.node] += h.mem
	l.count(h, -1)
}

func (l *ledger) give(h hold) {
	l.state[h.node].Remove(h.results...)
	l.cpu[h.node] -= h.cpu
	l.mem[h.node] -= h.mem
	l.count(h, 1)
}

// count moves the results' compute in (sign 1) or out of the free counts.
func (l *ledger) count(h hold, sign int) {
	for _, r := range h.results {
		for _, d := range r.Devices.Results {
			i, ok := gpuIndex(d.Device)
			if !ok || i >= len(l.free[h.node]) {
				continue
			}
			milli := topology.MilliPerGPU
			if q, ok := d.ConsumedCapacity[topology.CapacityMilliGPU]; ok && d.ShareID != nil {
				milli = int(q.Value())
			}
			l.free[h.node][i] += sign * milli
		}
	}
}

// commit records a placed job; rollback returns what a job that did not
// place in full took.
func (l *ledger) commit(key string, holds []hold) error {
	r := planner.Reservation{Job: key, Pods: map[string]string{}, Devices: map[string][]structured.DeviceID{}, Shares: map[string][]devicefit.Share{}}
	for i, h := range holds {
		node := l.c.Nodes[h.node].Name
		r.Pods[fmt.Sprintf("%s-%d", key, i)] = node
		for _, res := range h.results {
			for _, d := range res.Devices.Results {
				if d.ShareID == nil {
					r.Devices[node] = append(r.Devices[node], structured.MakeDeviceID(d.Driver, d.Pool, d.Device))
				}
			}
			r.Shares[node] = append(r.Shares[node], devicefit.Shares(res)...)
		}
	}
	if err := l.res.Add(r); err != nil {
		return fmt.Errorf("record job %s: %w", key, err)
	}
	l.held[key] = holds
	return nil
}

func (l *ledger) rollback(holds []hold) {
	for _, h := range holds {
		l.give(h)
	}
}

func (l *ledger) release(key string) {
	l.rollback(l.held[key])
	delete(l.held, key)
	l.res.Remove(key)
}

func (l *ledger) usage() planner.Usage { return planner.Measure(l.snap, l.res) }
