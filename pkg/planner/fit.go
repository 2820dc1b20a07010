package planner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"

	"github.com/gputopo/gputopo/pkg/devicefit"
)

// shape is a set of pods with identical claim specs and node
// constraints. The allocator gives every pod with the same claims (the
// shape's set) the same answer on the same node state, so one run serves
// them all; the node filters decide per shape.
type shape struct {
	pod    string // the pod whose claims stand for the shape
	claims []*resourceapi.ResourceClaim
	set    int // shapes with equal claims share a set
	need   int // devices the claims ask for at least
	// asks is need by kind, for people: gputopo's GPUs, and the devices
	// of every other DeviceClass.
	asks deviceCounts
	// needLocal is how many of need the node's own devices must give: the
	// devices of requests that can select no non-local device.
	needLocal int
	pods      int
	needs     needs
}

type fitKey struct {
	node string // cacheKey: shared by nodes that are alike for these claims
	set  int
	used string
}

type fitResult struct {
	ok  bool
	pos []int // devices the allocator picked, by position in the node
	// spos are the non-local devices it picked whole, by shared position;
	// sshares its shares of non-local devices that allow multiple
	// allocations.
	spos    []int
	sshares []devicefit.Share
	// rank is how far down their firstAvailable ladders the claims had to
	// go: the sum of the chosen subrequests' places (0 for first choices
	// and plain requests). Lower is better.
	rank int
}

// fitter answers "does a pod of this shape fit on this node on top of
// these devices?" for one plan, remembering every answer.
type fitter struct {
	ctx     context.Context
	eval    *devicefit.Evaluator
	c       *Cluster
	job     string
	base    nodeVec[bitset]      // in use before the plan, by node
	shares  nodeVec[*nodeShares] // shares held before the plan, by node
	sbase   bitset               // non-local devices in use before the plan
	sshares *nodeShares          // shares of non-local devices held before the plan
	// nlUsable are the non-local devices the job's requests could select;
	// nlPatterns the attributes of patterns that non-local devices have
	// too (findNonLocal).
	nlUsable   bitset
	nlPatterns []int
	shapes     []shape
	setIDs     map[string]int
	setPods    []int // pods with the set's claims, over all shapes
	values     []int // attributes the claims may read; nil: all of them
	patterns   []int // attributes the claims only compare between devices
	keys       []string
	memo       map[fitKey]fitResult
	capMemo    map[fitKey]int
	runs       int // allocator runs, for explanations and benchmarks
}

// keys is a cleared buffer as long as the cluster has nodes.
func newFitter(ctx context.Context, eval *devicefit.Evaluator, c *Cluster, job string, base nodeVec[bitset], keys []string) *fitter {
	return &fitter{ctx: ctx, eval: eval, c: c, job: job, base: base, keys: keys,
		memo: map[fitKey]fitResult{}, capMemo: map[fitKey]int{}, setIDs: map[string]int{}}
}

// addShape returns the shape of the pod's claims, adding it when new.
func (f *fitter) addShape(pod Pod, shapeIDs map[string]int) (int, error) {
	specs := make([]*resourceapi.ResourceClaimSpec, len(pod.Claims))
	for i, cl := range pod.Claims {
		if cl == nil {
			return 0, fmt.Errorf("pod %s has a nil claim", pod.Name)
		}
		if cl.Status.Allocation != nil {
			return 0, fmt.Errorf("claim %s of pod %s is already allocated", cl.Name, pod.Name)
		}
		specs[i] = &cl.Spec
	}
	raw, err := json.Marshal(specs)
	if err != nil {
		return 0, fmt.Errorf("encode claims of pod %s: %w", pod.Name, err)
	}
	ck, err := constraintKey(pod)
	if err != nil {
		return 0, err
	}
	set, ok := f.setIDs[string(raw)]
	if !ok {
		set = len(f.setPods)
		f.setIDs[string(raw)] = set
		f.setPods = append(f.setPods, 0)
	}
	f.setPods[set]++
	key := string(raw) + "\x00" + ck
	if id, ok := shapeIDs[key]; ok {
		f.shapes[id].pods++
		return id, nil
	}
	ns, err := f.c.needsOf(pod)
	if err != nil {
		return 0, err
	}
	asks := deviceCounts{}
	for _, s := range specs {
		for class, n := range minDevices(s) {
			asks.add(f.kind(class), n)
		}
	}
	shapeIDs[key] = len(f.shapes)
	f.shapes = append(f.shapes, shape{pod: pod.Name, claims: pod.Claims, set: set, need: asks.total(), asks: asks, pods: 1, needs: ns})
	return len(f.shapes) - 1, nil
}

// minDevices is the fewest devices the claim can be satisfied with, from
// the exact counts, by DeviceClass; "All" requests may match nothing, so
// they add none, and admin access takes no device from anyone, so it adds
// none either. A prioritized list counts its smallest subrequest, under
// that subrequest's class.
func minDevices(spec *resourceapi.ResourceClaimSpec) map[string]int {
	out := map[string]int{}
	for _, r := range spec.Devices.Requests {
		if class, n := requestNeed(r); n > 0 {
			out[class] += n
		}
	}
	return out
}

// requestNeed is minDevices for one request: its class and count.
func requestNeed(r resourceapi.DeviceRequest) (string, int) {
	if r.Exactly != nil {
		if r.Exactly.AllocationMode != resourceapi.DeviceAllocationModeAll && !ptr.Deref(r.Exactly.AdminAccess, false) {
			return r.Exactly.DeviceClassName, int(max(r.Exactly.Count, 1))
		}
		return r.Exactly.DeviceClassName, 0
	}
	least, class := -1, ""
	for _, sub := range r.FirstAvailable {
		c := 0
		if sub.AllocationMode != resourceapi.DeviceAllocationModeAll {
			c = int(max(sub.Count, 1))
		}
		if least < 0 || c < least {
			least, class = c, sub.DeviceClassName
		}
	}
	return class, max(least, 0)
}

// gpuKind is deviceCounts' key for gputopo's GPUs.
const gpuKind = ""

// kind is deviceCounts' key for a DeviceClass: gpuKind for the classes
// of gputopo's GPUs, else the class's name.
func (f *fitter) kind(class string) string {
	if gpuClass(f.eval, class) {
		return gpuKind
	}
	return class
}

// deviceCounts counts devices by kind (fitter.kind).
type deviceCounts map[string]int

func (d deviceCounts) add(kind string, n int) { d[kind] += n }

func (d deviceCounts) total() int {
	t := 0
	for _, n := range d {
		t += n
	}
	return t
}

// String says what the devices are: "2 GPUs", "1 GPU and 1
// nic.example.com device". GPUs are always named, so a pod that asks for
// nothing asks for "0 GPUs".
func (d deviceCounts) String() string {
	parts := []string{plural(d[gpuKind], "GPU")}
	if d[gpuKind] == 0 && len(d) > 1 {
		parts = nil
	}
	for _, class := range slices.Sorted(maps.Keys(d)) {
		if class != gpuKind && d[class] > 0 {
			parts = append(parts, plural(d[class], class+" device"))
		}
	}
	if len(parts) == 0 {
		return plural(0, "GPU")
	}
	if len(parts) == 1 {
		return parts[0]
	}
	return strings.Join(parts[:len(parts)-1], ", ") + " and " + parts[len(parts)-1]
}

// attrAccess is the only way a CEL expression may read attributes for the
// cache to skip those it does not name: a literal domain, then a field or a
// literal key. Anything else (a macro over the map, a variable key) makes
// every attribute relevant.
var attrAccess = regexp.MustCompile(`attributes\s*\[\s*"[^"]*"\s*\]\s*(\.\s*\??\s*[A-Za-z_]|\[\s*")`)

// findRelevant lists the attributes whose values the job's claims and
// their classes can read (their names appear in a CEL expression), and
// those only compared between devices (named by a constraint and nowhere
// else), for which the pattern of equal values is enough.
func (f *fitter) findRelevant() {
	var text strings.Builder
	constrained := map[string]bool{}
	opaque := false
	addCEL := func(sels []resourceapi.DeviceSelector) {
		for _, s := range sels {
			if s.CEL == nil {
				continue
			}
			e := s.CEL.Expression
			if strings.Count(e, "attributes") != len(attrAccess.FindAllString(e, -1)) {
				opaque = true
			}
			text.WriteString(e + "\n")
		}
	}
	addClass := func(name string) {
		cl, err := f.eval.Classes.Get(name)
		if err != nil {
			return // the allocator reports it
		}
		addCEL(cl.Spec.Selectors)
	}
	for _, s := range f.shapes {
		for _, cl := range s.claims {
			for _, r := range cl.Spec.Devices.Requests {
				if r.Exactly != nil {
					addCEL(r.Exactly.Selectors)
					addClass(r.Exactly.DeviceClassName)
				}
				for _, sub := range r.FirstAvailable {
					addCEL(sub.Selectors)
					addClass(sub.DeviceClassName)
				}
			}
			for _, c := range cl.Spec.Devices.Constraints {
				if c.MatchAttribute != nil {
					constrained[string(*c.MatchAttribute)] = true
				}
				if c.DistinctAttribute != nil {
					constrained[string(*c.DistinctAttribute)] = true
				}
			}
		}
	}
	if opaque {
		f.values, f.patterns = nil, nil
		return
	}
	cel := text.String()
	f.values, f.patterns = []int{}, []int{}
	for i, q := range f.c.sigs.attrNames {
		switch {
		case strings.Contains(cel, q[strings.LastIndex(q, "/")+1:]):
			f.values = append(f.values, i)
		case constrained[q]:
			f.patterns = append(f.patterns, i)
		}
	}
}

func (f *fitter) used(n int, extra bitset) bitset {
	b := f.base.at(n)
	if extra == nil {
		return b
	}
	out := extra.clone(len(f.c.nodes[n].devs))
	for i := range b {
		out[i] |= b[i]
	}
	return out
}

// freeDevices counts the devices, of any driver, the node can use that
// are in use neither before the plan nor by extra (its own) and sx
// (non-local ones held whole): its own, and of all, the non-local devices
// the job could select among them.
func (f *fitter) freeDevices(n int, extra, sx bitset) (own, all int) {
	nd := f.c.nodes[n]
	own = nd.all.free(f.used(n, extra))
	all = own
	if nd.reach.mask != nil && f.nlUsable != nil {
		all += nd.reach.mask.and(f.nlUsable).free(f.sharedUsed(sx))
	}
	return own, all
}

// sharedUsed is the non-local devices in use before the plan or in sx.
func (f *fitter) sharedUsed(sx bitset) bitset {
	if sx == nil {
		return f.sbase
	}
	out := sx.clone(f.c.sharedLen())
	for i := range f.sbase {
		out[i] |= f.sbase[i]
	}
	return out
}

// mayFit is the counting pre-filter: false only when the pod cannot fit.
func (f *fitter) mayFit(n, sh int, extra bitset, t taken) bool {
	if f.noPrefilter(n) {
		return true
	}
	own, all := f.freeDevices(n, extra, t.held)
	return own >= f.shapes[sh].needLocal && all >= f.shapes[sh].need
}

// fit runs the allocator for a pod of shape sh on node n with the devices
// of extra (the node's) and what t holds of the non-local ones taken too,
// or answers from the cache.
func (f *fitter) fit(n, sh int, extra bitset, t taken) (fitResult, error) {
	nd := f.c.nodes[n]
	used := f.used(n, extra)
	key := fitKey{node: f.key(n), set: f.shapes[sh].set, used: used.key()}
	if nd.reach.mask != nil && !t.empty() {
		// Nodes share keys only with nodes that can use the same
		// non-local devices (cacheKey), and those in use before the plan
		// are the plan's: what the plan took of them tells states apart.
		key.used += "|" + t.key(f.c, nd.reach.mask)
	}
	if r, ok := f.memo[key]; ok {
		return r, nil
	}
	if err := f.ctx.Err(); err != nil {
		return fitResult{}, err
	}
	s := &f.shapes[sh]
	r := fitResult{ok: true}
	if len(s.claims) > 0 {
		f.runs++
		sls, err := f.c.slicesFor(nd)
		if err != nil {
			return fitResult{}, err
		}
		results, err := f.eval.AllocateOn(f.ctx, nd.obj, sls, f.state(n, used, t, nil), s.claims)
		if err != nil {
			if ctxErr := f.ctx.Err(); ctxErr != nil {
				return fitResult{}, ctxErr
			}
			return fitResult{}, &BrokenClaimError{Job: f.job, Pod: s.pod, Node: nd.name, Err: err}
		}
		r.ok = results != nil
		r.rank = ladderRank(s.claims, results)
		for _, res := range results {
			for _, d := range res.Devices.Results {
				id := devicefit.DeviceID(d.Driver, d.Pool, d.Device)
				ref, local := f.c.dev(id)
				sp, shared := f.c.sharedPos(id)
				switch {
				case local && int(ref.node) != n, !local && !(shared && nd.reach.mask.has(sp)):
					return fitResult{}, fmt.Errorf("allocator picked device %s/%s/%s, which node %s cannot use", d.Driver, d.Pool, d.Device, nd.name)
				case !devicefit.Holds(&d):
					// admin access takes the device from no one
				case local:
					r.pos = append(r.pos, int(ref.pos))
				case d.ShareID != nil:
					r.sshares = append(r.sshares, devicefit.Share{Device: id, ShareID: string(*d.ShareID), Consumed: d.ConsumedCapacity})
				default:
					r.spos = append(r.spos, sp)
				}
			}
		}
	}
	f.memo[key] = r
	return r, nil
}

// ladderRank sums, over every firstAvailable request of the claims, the
// place of the subrequest the allocator picked. The allocator names a
// result of subrequest s of request r "r/s".
func ladderRank(claims []*resourceapi.ResourceClaim, results []resourceapi.AllocationResult) int {
	rank := 0
	for i, res := range results {
		if i >= len(claims) {
			break
		}
		seen := map[string]bool{}
		for _, d := range res.Devices.Results {
			req, sub, ok := strings.Cut(d.Request, "/")
			if !ok || seen[d.Request] {
				continue
			}
			seen[d.Request] = true
			for _, r := range claims[i].Spec.Devices.Requests {
				if r.Name != req {
					continue
				}
				for j, alt := range r.FirstAvailable {
					if alt.Name == sub {
						rank += j
					}
				}
			}
		}
	}
	return rank
}

// capacity is how many pods of shape sh fit on node n one after the other
// by their devices, up to limit. For nodes that are alike it is computed
// once, so it must not depend on anything but devices: the node filters
// apply on top. Non-local devices count for each node that can use them,
// so over several nodes capacities only bound what fits.
func (f *fitter) capacity(n, sh, limit int) (int, error) {
	nd := f.c.nodes[n]
	set := f.shapes[sh].set
	key := fitKey{node: f.key(n), set: set, used: f.base.at(n).key()}
	if c, ok := f.capMemo[key]; ok {
		return min(c, limit), nil
	}
	limit, asked := f.setPods[set], limit
	var extra bitset
	var t taken
	count := 0
	for count < limit && f.mayFit(n, sh, extra, t) {
		r, err := f.fit(n, sh, extra, t)
		if err != nil {
			return 0, err
		}
		if !r.ok {
			break
		}
		if extra == nil {
			extra = newBitset(len(nd.devs))
		}
		for _, p := range r.pos {
			extra.set(p)
		}
		t = t.with(r, f.c.sharedLen())
		count++
		if len(r.pos) == 0 && len(r.spos) == 0 && len(r.sshares) == 0 { // a pod without devices fits any number of times
			count = limit
		}
	}
	f.capMemo[key] = count
	return min(count, asked), nil
}

var errVerify = errors.New("the allocator no longer accepts the placement")

// fitsEmpty reports whether a pod of shape sh could ever fit on node n:
// the allocator run on the node with every device free, its own and the
// non-local ones, and no share taken. A claim whose selectors match no
// device the node can use (a misspelt value, a share where no GPU is
// published for sharing, a taint it does not tolerate) never fits, and a
// job that waits must not hold the node for it.
func (f *fitter) fitsEmpty(n, sh int) (bool, error) {
	s := &f.shapes[sh]
	if len(s.claims) == 0 || f.noPrefilter(n) {
		return true, nil
	}
	nd := f.c.nodes[n]
	key := fitKey{node: f.key(n), set: s.set, used: "\x00empty"}
	if r, ok := f.memo[key]; ok {
		return r.ok, nil
	}
	if err := f.ctx.Err(); err != nil {
		return false, err
	}
	f.runs++
	sls, err := f.c.slicesFor(nd)
	if err != nil {
		return false, err
	}
	results, err := f.eval.AllocateOn(f.ctx, nd.obj, sls, structured.AllocatedState{AllocatedDevices: devicefit.Allocated{}}, s.claims)
	if err != nil {
		if ctxErr := f.ctx.Err(); ctxErr != nil {
			return false, ctxErr
		}
		return false, &BrokenClaimError{Job: f.job, Pod: s.pod, Node: nd.name, Err: err}
	}
	f.memo[key] = fitResult{ok: results != nil}
	return results != nil, nil
}
