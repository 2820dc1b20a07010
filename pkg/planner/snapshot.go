package planner

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"

	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/gputopo/gputopo/pkg/devicefit"
)

// Snapshot is one cycle's view of the devices in use, taken from the
// allocation status of the cluster's ResourceClaims, and of what the pods
// on each node take from its allocatable. It is immutable: a plan works
// on its own copy of the nodes it touches.
type Snapshot struct {
	cluster *Cluster
	used    nodeVec[bitset]      // by node; nil where nothing is in use
	shares  nodeVec[*nodeShares] // by node; nil where no share is held
	usedRes nodeVec[[]int64]     // by node and resource index; nil where nothing is counted
	// sharedUsed and sharedShares are the same for the non-local devices,
	// by shared position; nil where nothing is in use.
	sharedUsed   bitset
	sharedShares *nodeShares
}

// NewSnapshot records which of the cluster's devices are allocated, its
// nodes' own and the non-local ones. Devices the cluster does not know
// are ignored. A shared device in allocated counts as held whole; see
// NewSnapshotFromState for shares.
func NewSnapshot(c *Cluster, allocated devicefit.Allocated, opts ...SnapshotOption) *Snapshot {
	s := &Snapshot{cluster: c, used: newNodeVec[bitset](len(c.nodes)), shares: newNodeVec[*nodeShares](len(c.nodes)), usedRes: newNodeVec[[]int64](len(c.nodes))}
	for id := range allocated {
		s.mark(id)
	}
	for _, o := range opts {
		o(s)
	}
	s.used.freeze()
	s.usedRes.freeze()
	return s
}

// Cluster is the tree the snapshot was taken of.
func (s *Snapshot) Cluster() *Cluster { return s.cluster }

func (s *Snapshot) mark(id structured.DeviceID) {
	ref, ok := s.cluster.dev(id)
	if !ok {
		if p, ok := s.cluster.sharedPos(id); ok {
			if s.sharedUsed == nil {
				s.sharedUsed = newBitset(s.cluster.sharedLen())
			}
			s.sharedUsed.set(p)
		}
		return
	}
	n := s.cluster.nodes[ref.node]
	if s.used.at(int(ref.node)) == nil {
		s.used.set(int(ref.node), newBitset(len(n.devs)))
	}
	s.used.at(int(ref.node)).set(int(ref.pos))
}

// withReservations returns the devices in use once every reservation but
// the job's own is counted, copying only the nodes reservations touch:
// the nodes' own devices by node, and the non-local ones.
func (s *Snapshot) withReservations(res *Reservations, except string) (nodeVec[bitset], bitset) {
	used := s.used // shared when a reservation first touches a node
	shared := s.sharedUsed
	var copied map[int32]bool
	sharedCopied := false
	res.each(except, func(id structured.DeviceID) {
		ref, ok := s.cluster.dev(id)
		if !ok {
			if p, ok := s.cluster.sharedPos(id); ok {
				if !sharedCopied {
					sharedCopied = true
					shared = shared.clone(s.cluster.sharedLen())
				}
				shared.set(p)
			}
			return
		}
		n := int(ref.node)
		if copied == nil {
			copied = map[int32]bool{}
			used = s.used.share()
		}
		if !copied[ref.node] {
			copied[ref.node] = true
			used.set(n, used.at(n).clone(len(s.cluster.nodes[n].devs)))
		}
		used.at(n).set(int(ref.pos))
	})
	return used, shared
}

// resourcesInUse returns what is taken from each node's allocatable once
// every reservation but the job's own is counted, copying only the nodes
// reservations touch.
func (s *Snapshot) resourcesInUse(res *Reservations, except string) nodeVec[[]int64] {
	used := s.usedRes // shared when a reservation first touches a node
	var copied map[int]bool
	res.eachJob(except, func(r Reservation) {
		for node, l := range r.Requests {
			i, ok := s.cluster.byName[node]
			if !ok || s.cluster.nodes[i].alloc == nil {
				continue
			}
			if copied == nil {
				copied = map[int]bool{}
				used = s.usedRes.share()
			}
			if !copied[i] {
				copied[i] = true
				used.set(i, slices.Clone(used.at(i)))
			}
			used.set(i, s.cluster.res.add(used.at(i), l))
		}
	})
	return used
}

// Reservation is what a job's plan holds while its pods are gated: the
// node of each pod, the devices of each node and what the pods take from
// each node's allocatable.
type Reservation struct {
	Job     string
	Pods    map[string]string                // pod → node
	Devices map[string][]structured.DeviceID // node → devices held whole
	// Shares are the shares of shared devices, by node. Several jobs may
	// hold shares of one device; the allocator keeps them within it.
	Shares map[string][]devicefit.Share
	// Requests sums, per node, the requests of the pods planned there
	// and one pod slot each. Those pods must not be counted in the
	// snapshot's WithUsed as well.
	Requests NodeUsage
}

// Reservation is the hold the controller records before it pins the pods.
func (p *Plan) Reservation() Reservation {
	return p.reservation(p.Assignments, p.Requests.clone())
}

// Split takes pods, of the job's, out of the plan: it returns the plan
// without them and the reservation of what the plan gave them (their
// devices, and their requests and pod slots by node).
func (p *Plan) Split(pods []Pod) (*Plan, Reservation) {
	assign := map[string]string{}
	requests := NodeUsage{}
	rest := *p
	rest.Assignments, rest.Allocations, rest.Requests = maps.Clone(p.Assignments), maps.Clone(p.Allocations), p.Requests.clone()
	for _, pod := range pods {
		n, ok := p.Assignments[pod.Name]
		if !ok {
			continue
		}
		assign[pod.Name] = n
		requests.addRequests(n, pod.Requests)
		delete(rest.Assignments, pod.Name)
		delete(rest.Allocations, pod.Name)
		rest.Requests.subRequests(n, pod.Requests)
	}
	return &rest, p.reservation(assign, requests)
}

// With is r and o held as one, by r's job.
func (r Reservation) With(o Reservation) Reservation {
	out := r.clone()
	if out.Pods == nil {
		out.Pods = map[string]string{}
	}
	maps.Copy(out.Pods, o.Pods)
	for n, ids := range o.Devices {
		out.Devices[n] = append(out.Devices[n], ids...)
	}
	for n, sh := range o.Shares {
		if out.Shares == nil {
			out.Shares = map[string][]devicefit.Share{}
		}
		out.Shares[n] = append(out.Shares[n], sh...)
	}
	if out.Requests == nil {
		out.Requests = NodeUsage{}
	}
	for n, l := range o.Requests {
		out.Requests.addList(n, l)
	}
	return out
}

func (p *Plan) reservation(assign map[string]string, requests NodeUsage) Reservation {
	r := Reservation{Job: p.Job, Pods: maps.Clone(assign), Devices: map[string][]structured.DeviceID{}, Requests: requests}
	for pod, results := range p.Allocations {
		if _, ok := assign[pod]; !ok {
			continue
		}
		node := p.Assignments[pod]
		for _, res := range results {
			for _, d := range res.Devices.Results {
				if d.ShareID == nil && devicefit.Holds(&d) {
					r.Devices[node] = append(r.Devices[node], structured.MakeDeviceID(d.Driver, d.Pool, d.Device))
				}
			}
			if shares := devicefit.Shares(res); len(shares) > 0 {
				if r.Shares == nil {
					r.Shares = map[string][]devicefit.Share{}
				}
				r.Shares[node] = append(r.Shares[node], shares...)
			}
		}
	}
	for node := range r.Devices {
		sort.Slice(r.Devices[node], func(a, b int) bool { return r.Devices[node][a].String() < r.Devices[node][b].String() })
	}
	return r
}

func (r Reservation) clone() Reservation {
	out := Reservation{Job: r.Job, Pods: maps.Clone(r.Pods), Devices: make(map[string][]structured.DeviceID, len(r.Devices)), Requests: r.Requests.clone()}
	for n, ids := range r.Devices {
		out.Devices[n] = slices.Clone(ids)
	}
	if r.Shares != nil {
		out.Shares = make(map[string][]devicefit.Share, len(r.Shares))
		for n, sh := range r.Shares {
			out.Shares[n] = slices.Clone(sh)
		}
	}
	return out
}

// ConflictError is returned when a reservation would take a device that
// another job already holds.
type ConflictError struct {
	Job, Holder string
	Device      structured.DeviceID
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("reserve for job %s: device %s is held by job %s", e.Job, e.Device, e.Holder)
}

// Reservations are the devices held by plans whose pods are not yet
// bound. They count as allocated for every other job's plan, and no device
// is ever held twice. Safe for concurrent use.
type Reservations struct {
	mu    sync.RWMutex
	jobs  map[string]Reservation
	owner map[structured.DeviceID]string
}

// NewReservations returns an empty set.
func NewReservations() *Reservations {
	return &Reservations{jobs: map[string]Reservation{}, owner: map[structured.DeviceID]string{}}
}

// Add records r, replacing the job's earlier reservation. It fails,
// changing nothing, when another job holds one of the devices.
func (rs *Reservations) Add(r Reservation) error {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for _, ids := range r.Devices {
		for _, id := range ids {
			if holder, ok := rs.owner[id]; ok && holder != r.Job {
				return &ConflictError{Job: r.Job, Holder: holder, Device: id}
			}
		}
	}
	rs.removeLocked(r.Job)
	r = r.clone()
	rs.jobs[r.Job] = r
	for _, ids := range r.Devices {
		for _, id := range ids {
			rs.owner[id] = r.Job
		}
	}
	return nil
}

// Remove drops the job's reservation, e.g. once its pods are bound and
// their claims allocated, or when the plan is abandoned.
func (rs *Reservations) Remove(job string) bool {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.removeLocked(job)
}

func (rs *Reservations) removeLocked(job string) bool {
	r, ok := rs.jobs[job]
	if !ok {
		return false
	}
	for _, ids := range r.Devices {
		for _, id := range ids {
			delete(rs.owner, id)
		}
	}
	delete(rs.jobs, job)
	return true
}

// Get returns a copy of the job's reservation.
func (rs *Reservations) Get(job string) (Reservation, bool) {
	rs.mu.RLock()
	defer rs.mu.RUnlock()
	r, ok := rs.jobs[job]
	if !ok {
		return Reservation{}, false
	}
	return r.clone(), true
}

// Jobs lists the jobs holding reservations, sorted.
func (rs *Reservations) Jobs() []string {
	rs.mu.RLock()
	defer rs.mu.RUnlock()
	return slices.Sorted(maps.Keys(rs.jobs))
}

// eachJob calls fn for the reservation of every job but except. A nil
// set holds nothing.
func (rs *Reservations) eachJob(except string, fn func(Reservation)) {
	if rs == nil {
		return
	}
	rs.mu.RLock()
	defer rs.mu.RUnlock()
	for job, r := range rs.jobs {
		if job != except {
			fn(r)
		}
	}
}

// each calls fn for every held device except the job's own. A nil set
// holds nothing.
func (rs *Reservations) each(except string, fn func(structured.DeviceID)) {
	if rs == nil {
		return
	}
	rs.mu.RLock()
	defer rs.mu.RUnlock()
	for id, job := range rs.owner {
		if job != except {
			fn(id)
		}
	}
}
