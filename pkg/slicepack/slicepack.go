// Package slicepack keeps ResourceSlices small in a cache that holds every
// node's devices. A decoded device attribute map is most of what a cached
// GPU costs (in resource.k8s.io/v1 of Kubernetes 1.37 a DeviceAttribute
// is 128 bytes, so a map of 20 attributes is a table of about 5 KB),
// while the values themselves are a few hundred bytes. Pack moves the
// attributes of a slice's devices into one annotation, serialized
// (codec.go);
// Unpack gives back a slice equal to the one packed. The devices keep
// every other field (names, capacity, taints, counters), so what reads
// only those (the resourceslice tracker applying DeviceTaintRules, which
// select devices by driver, pool and name; the tree's device index) reads
// a packed slice as it is. What reads attributes (the structured
// allocator, node signatures) reads the unpacked one, which Cache keeps
// for the nodes recently read.
//
// The package reads and writes no cluster state; the annotation exists
// only in the memory of the process that packed the slice and is never
// sent to the API server.
package slicepack

import (
	"crypto/rand"
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/utils/lru"

	"github.com/gputopo/gputopo/pkg/topology"
)

// Annotation holds a packed slice's device attributes.
const Annotation = topology.AnnotationPackedAttributes

// mark starts every value Pack writes: random, made when the process
// starts, so a value the API server sent under the same name is never
// taken for one.
var mark = func() string {
	return "gputopo-packed:" + rand.Text() + ":"
}()

// Pack moves the attributes of every device of s into Annotation, in
// place. A slice without attributes stays as it is. An Annotation the
// slice came with is dropped first, so that only what Pack wrote is ever
// unpacked. Packing a slice Pack packed before changes nothing: informer
// transforms must be idempotent (client-go's streaming list runs them
// twice on every listed object).
func Pack(s *resourceapi.ResourceSlice) error {
	if Packed(s) {
		return nil
	}
	Strip(s)
	if !slices.ContainsFunc(s.Spec.Devices, func(d resourceapi.Device) bool { return len(d.Attributes) > 0 }) {
		return nil
	}
	b := encode([]byte(mark), s.Spec.Devices)
	ann := make(map[string]string, len(s.Annotations)+1)
	for k, v := range s.Annotations {
		ann[k] = v
	}
	ann[Annotation] = string(b)
	s.Annotations = ann
	for i := range s.Spec.Devices {
		s.Spec.Devices[i].Attributes = nil
	}
	return nil
}

// Strip drops Annotation from s, in place.
func Strip(s *resourceapi.ResourceSlice) {
	if _, ok := s.Annotations[Annotation]; !ok {
		return
	}
	ann := make(map[string]string, len(s.Annotations)-1)
	for k, v := range s.Annotations {
		if k != Annotation {
			ann[k] = v
		}
	}
	if len(ann) == 0 {
		ann = nil
	}
	s.Annotations = ann
}

// Packed reports whether s holds its attributes in Annotation, written
// by Pack in this process.
func Packed(s *resourceapi.ResourceSlice) bool {
	return strings.HasPrefix(s.Annotations[Annotation], mark)
}

// Unpack returns s with its devices' attributes back in place: s itself
// when it is not packed, otherwise a copy that shares everything but the
// device list and its annotations with s, which stays unchanged.
func Unpack(s *resourceapi.ResourceSlice) (*resourceapi.ResourceSlice, error) {
	if !Packed(s) {
		return s, nil
	}
	devs, err := decode(strings.TrimPrefix(s.Annotations[Annotation], mark))
	if err != nil {
		return nil, fmt.Errorf("unpack the attributes of ResourceSlice %s: %w", s.Name, err)
	}
	if len(devs) != len(s.Spec.Devices) {
		return nil, fmt.Errorf("unpack the attributes of ResourceSlice %s: %d devices packed, the slice has %d", s.Name, len(devs), len(s.Spec.Devices))
	}
	out := *s
	out.Spec.Devices = make([]resourceapi.Device, len(s.Spec.Devices))
	for i := range s.Spec.Devices {
		d := s.Spec.Devices[i]
		if devs[i].name != d.Name {
			return nil, fmt.Errorf("unpack the attributes of ResourceSlice %s: device %d is %s, packed as %s", s.Name, i, d.Name, devs[i].name)
		}
		d.Attributes = devs[i].attrs
		out.Spec.Devices[i] = d
	}
	Strip(&out)
	return &out, nil
}

// Cache unpacks slices and keeps the last ones it unpacked, by the
// packed slice's address: cached slices are never written, so a slice
// at an address always unpacks the same. It is safe for concurrent use.
type Cache struct {
	lru *lru.Cache
}

// NewCache returns a cache of the size slices last unpacked.
func NewCache(size int) *Cache {
	return &Cache{lru: lru.New(size)}
}

// Unpack is Unpack through the cache. A nil cache keeps nothing.
func (c *Cache) Unpack(s *resourceapi.ResourceSlice) (*resourceapi.ResourceSlice, error) {
	if !Packed(s) {
		return s, nil
	}
	if c == nil {
		return Unpack(s)
	}
	if v, ok := c.lru.Get(s); ok {
		return v.(*resourceapi.ResourceSlice), nil
	}
	out, err := Unpack(s)
	if err != nil {
		return nil, err
	}
	c.lru.Add(s, out)
	return out, nil
}

// UnpackAll unpacks each of in without keeping anything: for reads that
// touch every node once. It returns in itself when none is packed.
func UnpackAll(in []*resourceapi.ResourceSlice) ([]*resourceapi.ResourceSlice, error) {
	var none *Cache
	return none.UnpackAll(in)
}

// UnpackAll unpacks each of in through the cache. It returns in itself
// when none is packed.
func (c *Cache) UnpackAll(in []*resourceapi.ResourceSlice) ([]*resourceapi.ResourceSlice, error) {
	first := -1
	for i, s := range in {
		if Packed(s) {
			first = i
			break
		}
	}
	if first < 0 {
		return in, nil
	}
	out := make([]*resourceapi.ResourceSlice, len(in))
	copy(out, in[:first])
	for i := first; i < len(in); i++ {
		s, err := c.Unpack(in[i])
		if err != nil {
			return nil, err
		}
		out[i] = s
	}
	return out, nil
}
