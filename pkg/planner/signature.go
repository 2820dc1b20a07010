package planner

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gputopo/gputopo/pkg/slicepack"
)

// Node signatures let one allocator run answer for many nodes. Two nodes
// with the same signature and the same devices in use get the same answer
// from the allocator, up to pool and node names, as long as the claims do
// not look at the attributes in which they differ (a UUID, a leaf name).
// The signature is therefore split: a core (device names, capacities,
// taints, which attributes exist) and one value per attribute, and a plan
// keys its cache by the core plus only the attributes its claims mention.
// Every value is interned, so keys compare exactly: no hash collisions.

type nodeSig struct {
	core  int32   // -1: the node uses features the signature does not capture
	attrs []int32 // by attribute index; 0 where the node lacks the attribute
	// pats is, per attribute, only which devices share a value: all that
	// matchAttribute and distinctAttribute look at. NVLink block IDs are
	// unique per node, but every DGX has the same blocks.
	pats []int32
}

type signatures struct {
	intern    map[string]int32
	attrIdx   map[string]int
	attrNames []string // qualified: domain/name
	pending   [][][3]int32

	// Scratch space reused from node to node: building signatures for
	// thousands of nodes must not allocate per attribute.
	core   []byte
	values map[string]*attrValues
	names  []resourceapi.QualifiedName
	qual   map[[2]string]string
}

// attrValues is one attribute's values over a node's devices, each
// length-prefixed; a device without the attribute is a lone 0xff.
type attrValues struct {
	buf  []byte
	offs []int // where each device's value starts in buf
	pat  []byte
	seen bool
}

func (v *attrValues) pad(pos int) {
	for len(v.offs) < pos {
		v.offs = append(v.offs, len(v.buf))
		v.buf = append(v.buf, 0xff)
	}
}

func (v *attrValues) value(i int) []byte {
	end := len(v.buf)
	if i+1 < len(v.offs) {
		end = v.offs[i+1]
	}
	return v.buf[v.offs[i]:end]
}

// pattern numbers the distinct values in order of first appearance:
// b0,b0,b1,b1 and x,x,y,y both become 0,0,1,1. Absent stays absent. List
// values match when they share an element, which equality cannot
// capture, so they keep their full values.
func (v *attrValues) pattern() []byte {
	v.pat = v.pat[:0]
	for i := range v.offs {
		if val := v.value(i); len(val) > 0 && val[0] == 'l' {
			return append(append(v.pat[:0], v.buf...), 'L')
		}
	}
	for i := range v.offs {
		val := v.value(i)
		if len(val) == 1 && val[0] == 0xff {
			v.pat = append(v.pat, 0xff)
			continue
		}
		ord, next := -1, 0
		for j := 0; j < i && ord < 0; j++ {
			prev := v.value(j)
			if len(prev) == 1 && prev[0] == 0xff {
				continue
			}
			if string(prev) == string(val) {
				ord = int(v.pat[j])
			}
			next = max(next, int(v.pat[j])+1)
		}
		if ord < 0 {
			ord = next
		}
		v.pat = append(v.pat, byte(min(ord, 0xfe)))
	}
	return append(v.pat, 'P')
}

func (s *signatures) init() {
	s.intern = map[string]int32{}
	s.attrIdx = map[string]int{}
	s.values = map[string]*attrValues{}
	s.qual = map[[2]string]string{}
}

func (s *signatures) id(b []byte) int32 {
	if v, ok := s.intern[string(b)]; ok {
		return v
	}
	v := int32(len(s.intern) + 1)
	s.intern[string(b)] = v
	return v
}

// add computes n's signature; it runs in NewCluster, once per node.
func (s *signatures) add(n *node) error {
	// Signatures are computed for every node of the tree at each full
	// build: what they unpack is not kept.
	full, err := slicepack.UnpackAll(n.slices)
	if err != nil {
		return err
	}
	b := s.core[:0]
	cacheable := true
	var pools []string
	for _, sl := range full {
		if k := sl.Spec.Driver + "\x00" + sl.Spec.Pool.Name; !slices.Contains(pools, k) {
			pools = append(pools, k)
		}
	}
	sorted := slices.Sorted(slices.Values(pools))
	for _, v := range s.values {
		v.buf, v.offs, v.seen = v.buf[:0], v.offs[:0], false
	}
	pos := 0
	for _, sl := range full {
		spec := &sl.Spec
		if len(spec.SharedCounters) > 0 || spec.PartitionTypeAttribute != nil || len(spec.SkipNodeOperations) > 0 {
			cacheable = false
		}
		b = append(b, 'S')
		b = appendStr(b, spec.Driver)
		b = binary.AppendUvarint(b, uint64(slices.Index(sorted, spec.Driver+"\x00"+spec.Pool.Name)))
		b = binary.AppendVarint(b, spec.Pool.ResourceSliceCount)
		for i := range spec.Devices {
			d := &spec.Devices[i]
			if len(d.ConsumesCounters) > 0 || d.NodeName != nil || d.NodeSelector != nil || d.AllNodes != nil ||
				d.BindsToNode != nil || len(d.BindingConditions) > 0 || len(d.BindingFailureConditions) > 0 ||
				d.AllowMultipleAllocations != nil || len(d.NodeAllocatableResources) > 0 {
				cacheable = false
			}
			b = append(b, 'D')
			b = appendStr(b, d.Name)
			for _, k := range s.sorted(d.Capacity) {
				c := d.Capacity[k]
				if c.RequestPolicy != nil {
					cacheable = false
				}
				b = append(b, 'C')
				b = appendStr(b, string(k))
				b = appendStr(b, c.Value.String())
			}
			for _, t := range d.Taints {
				b = append(b, 'T')
				b = appendStr(b, t.Key)
				b = appendStr(b, t.Value)
				b = appendStr(b, string(t.Effect))
			}
			for _, k := range s.sortedAttrs(d.Attributes) {
				q := s.qualify(spec.Driver, string(k))
				b = append(b, 'A')
				b = appendStr(b, q)
				v := s.values[q]
				if v == nil {
					v = &attrValues{}
					s.values[q] = v
				}
				v.seen = true
				v.pad(pos)
				v.offs = append(v.offs, len(v.buf))
				v.buf = appendAttr(v.buf, d.Attributes[k])
			}
			pos++
		}
	}
	s.core = b
	n.sig.core = -1
	if cacheable {
		n.sig.core = s.id(b)
	}
	var pairs [][3]int32
	for q, v := range s.values {
		if !v.seen {
			continue
		}
		idx, ok := s.attrIdx[q]
		if !ok {
			idx = len(s.attrNames)
			s.attrIdx[q] = idx
			s.attrNames = append(s.attrNames, q)
		}
		v.pad(pos)
		pat := s.id(v.pattern())
		v.buf = append(v.buf, 'V') // keeps value keys apart from core keys
		pairs = append(pairs, [3]int32{int32(idx), s.id(v.buf), pat})
	}
	s.pending = append(s.pending, pairs)
	return nil
}

func (s *signatures) sorted(m map[resourceapi.QualifiedName]resourceapi.DeviceCapacity) []resourceapi.QualifiedName {
	s.names = s.names[:0]
	for k := range m {
		s.names = append(s.names, k)
	}
	slices.Sort(s.names)
	return s.names
}

func (s *signatures) sortedAttrs(m map[resourceapi.QualifiedName]resourceapi.DeviceAttribute) []resourceapi.QualifiedName {
	s.names = s.names[:0]
	for k := range m {
		s.names = append(s.names, k)
	}
	slices.Sort(s.names)
	return s.names
}

// qualify names an attribute the way CEL sees it: domain/name, the
// domain being the driver's when the slice leaves it out.
func (s *signatures) qualify(driver, name string) string {
	if q, ok := s.qual[[2]string{driver, name}]; ok {
		return q
	}
	q := name
	if !strings.Contains(name, "/") {
		q = driver + "/" + name
	}
	s.qual[[2]string{driver, name}] = q
	return q
}

// finish spreads the per-node attribute values over the final attribute
// list and drops what only construction needed.
func (s *signatures) finish(nodes []*node) {
	for i, n := range nodes {
		n.sig.attrs = make([]int32, len(s.attrNames))
		n.sig.pats = make([]int32, len(s.attrNames))
		for _, p := range s.pending[i] {
			n.sig.attrs[p[0]] = p[1]
			n.sig.pats[p[0]] = p[2]
		}
	}
	*s = signatures{attrIdx: s.attrIdx, attrNames: s.attrNames}
}

func appendStr(b []byte, str string) []byte {
	b = binary.AppendUvarint(b, uint64(len(str)))
	return append(b, str...)
}

func appendAttr(b []byte, a resourceapi.DeviceAttribute) []byte {
	switch {
	case a.IntValue != nil:
		return binary.AppendVarint(append(b, 'i'), *a.IntValue)
	case a.BoolValue != nil:
		return appendStr(append(b, 'b'), strconv.FormatBool(*a.BoolValue))
	case a.StringValue != nil:
		return appendStr(append(b, 's'), *a.StringValue)
	case a.VersionValue != nil:
		return appendStr(append(b, 'v'), *a.VersionValue)
	}
	return appendStr(append(b, 'l'), fmt.Sprintf("%q%v%v%q", a.StringValues, a.IntValues, a.BoolValues, a.VersionValues))
}

// cacheKey is n's key for a plan whose claims read the values of the
// attributes in values (nil: all of them) and compare those in patterns
// only with each other.
//
// A node that can use non-local devices shares its key only with nodes
// that can use the same ones. Where the node depends on them for the
// plan (fitter.dependent), the plan keys its state with what it took of
// them (fitter.fit), and the attributes of patterns that non-local
// devices have too (nlPatterns) count by value: a constraint may compare
// a device of its own with a non-local one. A dependent node where a
// non-local device it can use is of a driver that also publishes on the
// node has a key of its own, since the allocator's order of pools, and so
// its answer, then depends on the names of the node's pools; so has one
// whose selectors could not be matched.
func (n *node) cacheKey(values, patterns []int, dependent bool, nlPatterns []int) string {
	if n.sig.core < 0 || n.reach.broken || (dependent && n.reach.sameDriver) {
		return "n" + strconv.Itoa(n.idx)
	}
	if dependent && values != nil && len(nlPatterns) > 0 {
		values = append(slices.Clone(values), nlPatterns...)
		patterns = slices.DeleteFunc(slices.Clone(patterns), func(r int) bool { return slices.Contains(nlPatterns, r) })
	}
	buf := make([]byte, 0, 8+4*len(values)+4*len(patterns)+8*len(n.reach.mask))
	buf = binary.LittleEndian.AppendUint32(buf, uint32(n.sig.core))
	if values == nil {
		for _, v := range n.sig.attrs {
			buf = binary.LittleEndian.AppendUint32(buf, uint32(v))
		}
	} else {
		for _, r := range values {
			buf = binary.LittleEndian.AppendUint32(buf, uint32(n.sig.attrs[r]))
		}
		buf = append(buf, '|')
		for _, r := range patterns {
			buf = binary.LittleEndian.AppendUint32(buf, uint32(n.sig.pats[r]))
		}
	}
	if n.reach.mask != nil {
		buf = append(buf, 'R')
		for _, w := range n.reach.mask {
			buf = binary.LittleEndian.AppendUint64(buf, w)
		}
	}
	return string(buf)
}

// bitset marks devices by their position in a node.
type bitset []uint64

func newBitset(n int) bitset { return make(bitset, (n+63)/64) }

func (b bitset) set(i int)      { b[i/64] |= 1 << (i % 64) }
func (b bitset) unset(i int)    { b[i/64] &^= 1 << (i % 64) }
func (b bitset) has(i int) bool { return i/64 < len(b) && b[i/64]&(1<<(i%64)) != 0 }

func (b bitset) clone(size int) bitset {
	out := newBitset(size)
	copy(out, b)
	return out
}

// free counts the bits of mask not in used.
func (mask bitset) free(used bitset) int {
	n := 0
	for i, w := range mask {
		if i < len(used) {
			w &^= used[i]
		}
		n += bits.OnesCount64(w)
	}
	return n
}

// and returns the bits in both; nil when none is.
func (b bitset) and(o bitset) bitset {
	var out bitset
	for i := range min(len(b), len(o)) {
		if w := b[i] & o[i]; w != 0 {
			if out == nil {
				out = make(bitset, min(len(b), len(o)))
			}
			out[i] = w
		}
	}
	return out
}

func (b bitset) intersects(o bitset) bool {
	for i := range min(len(b), len(o)) {
		if b[i]&o[i] != 0 {
			return true
		}
	}
	return false
}

func (b bitset) count() int {
	n := 0
	for _, w := range b {
		n += bits.OnesCount64(w)
	}
	return n
}

// key identifies the set; trailing zero words are dropped so an empty set
// has one key however it was built.
func (b bitset) key() string {
	for len(b) > 0 && b[len(b)-1] == 0 {
		b = b[:len(b)-1]
	}
	buf := make([]byte, 0, 8*len(b))
	for _, w := range b {
		buf = binary.LittleEndian.AppendUint64(buf, w)
	}
	return string(buf)
}
