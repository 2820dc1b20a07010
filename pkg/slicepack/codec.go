package slicepack

import (
	"encoding/binary"
	"errors"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
)

// The packed form, after mark: per device its name and attribute count,
// then per attribute its name, a byte saying which of the eight value
// fields are set, and those values in field order. Integers are varints,
// strings and lists length-prefixed. Unpacking points every string of
// the maps it builds into the packed string itself, and takes each
// device's pointers from one array per kind: a device costs its map and
// a few arrays, not an allocation per value.

const (
	hasInt = 1 << iota
	hasBool
	hasString
	hasVersion
	hasInts
	hasBools
	hasStrings
	hasVersions
)

func appendStr(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

func appendStrs(b []byte, ss []string) []byte {
	b = binary.AppendUvarint(b, uint64(len(ss)))
	for _, s := range ss {
		b = appendStr(b, s)
	}
	return b
}

func encode(b []byte, devs []resourceapi.Device) []byte {
	b = binary.AppendUvarint(b, uint64(len(devs)))
	for i := range devs {
		d := &devs[i]
		b = appendStr(b, d.Name)
		b = binary.AppendUvarint(b, uint64(len(d.Attributes)))
		for k, a := range d.Attributes {
			b = appendStr(b, string(k))
			var set byte
			for bit, on := range [...]bool{a.IntValue != nil, a.BoolValue != nil, a.StringValue != nil, a.VersionValue != nil,
				a.IntValues != nil, a.BoolValues != nil, a.StringValues != nil, a.VersionValues != nil} {
				if on {
					set |= 1 << bit
				}
			}
			b = append(b, set)
			if a.IntValue != nil {
				b = binary.AppendVarint(b, *a.IntValue)
			}
			if a.BoolValue != nil {
				b = append(b, boolByte(*a.BoolValue))
			}
			if a.StringValue != nil {
				b = appendStr(b, *a.StringValue)
			}
			if a.VersionValue != nil {
				b = appendStr(b, *a.VersionValue)
			}
			if a.IntValues != nil {
				b = binary.AppendUvarint(b, uint64(len(a.IntValues)))
				for _, v := range a.IntValues {
					b = binary.AppendVarint(b, v)
				}
			}
			if a.BoolValues != nil {
				b = binary.AppendUvarint(b, uint64(len(a.BoolValues)))
				for _, v := range a.BoolValues {
					b = append(b, boolByte(v))
				}
			}
			if a.StringValues != nil {
				b = appendStrs(b, a.StringValues)
			}
			if a.VersionValues != nil {
				b = appendStrs(b, a.VersionValues)
			}
		}
	}
	return b
}

func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}

var errShort = errors.New("packed form ends early")

// decoder reads the packed form; strings it returns share its memory.
type decoder struct {
	s   string
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	var v uint64
	for shift := 0; shift < 64; shift += 7 {
		if len(d.s) == 0 {
			d.err = errShort
			return 0
		}
		c := d.s[0]
		d.s = d.s[1:]
		if shift == 63 && c > 1 {
			break // past 64 bits
		}
		v |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return v
		}
	}
	d.err = errors.New("packed form has a varint longer than 64 bits")
	return 0
}

func (d *decoder) varint() int64 {
	u := d.uvarint()
	return int64(u>>1) ^ -int64(u&1)
}

// count reads a length and checks that at least that many bytes remain,
// so a corrupt length cannot make a huge allocation.
func (d *decoder) count() int {
	n := d.uvarint()
	if d.err == nil && n > uint64(len(d.s)) {
		d.err = fmt.Errorf("packed form announces %d items in %d bytes", n, len(d.s))
	}
	if d.err != nil {
		return 0
	}
	return int(n)
}

func (d *decoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if len(d.s) == 0 {
		d.err = errShort
		return 0
	}
	c := d.s[0]
	d.s = d.s[1:]
	return c
}

func (d *decoder) str() string {
	n := d.count()
	if d.err != nil {
		return ""
	}
	v := d.s[:n]
	d.s = d.s[n:]
	return v
}

func (d *decoder) strs() []string {
	n := d.count()
	out := make([]string, n)
	for i := range out {
		out[i] = d.str()
	}
	return out
}

// decodedDevice is one device's name and attributes.
type decodedDevice struct {
	name  string
	attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
}

func decode(s string) ([]decodedDevice, error) {
	d := &decoder{s: s}
	out := make([]decodedDevice, d.count())
	for i := range out {
		out[i].name = d.str()
		n := d.count()
		if d.err != nil {
			break
		}
		if n == 0 {
			continue
		}
		// One array per kind of pointer for the whole device, sized by
		// the attributes: a value of each kind at most per attribute.
		attrs := make(map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, n)
		var ints []int64
		var bools []bool
		var strs []string
		for range n {
			k := resourceapi.QualifiedName(d.str())
			set := d.byte()
			if d.err != nil {
				break
			}
			var a resourceapi.DeviceAttribute
			if set&hasInt != 0 {
				if ints == nil {
					ints = make([]int64, 0, n)
				}
				ints = append(ints, d.varint())
				a.IntValue = &ints[len(ints)-1]
			}
			if set&hasBool != 0 {
				if bools == nil {
					bools = make([]bool, 0, n)
				}
				bools = append(bools, d.byte() != 0)
				a.BoolValue = &bools[len(bools)-1]
			}
			if set&(hasString|hasVersion) != 0 && strs == nil {
				strs = make([]string, 0, 2*n)
			}
			if set&hasString != 0 {
				strs = append(strs, d.str())
				a.StringValue = &strs[len(strs)-1]
			}
			if set&hasVersion != 0 {
				strs = append(strs, d.str())
				a.VersionValue = &strs[len(strs)-1]
			}
			if set&hasInts != 0 {
				a.IntValues = make([]int64, d.count())
				for j := range a.IntValues {
					a.IntValues[j] = d.varint()
				}
			}
			if set&hasBools != 0 {
				a.BoolValues = make([]bool, d.count())
				for j := range a.BoolValues {
					a.BoolValues[j] = d.byte() != 0
				}
			}
			if set&hasStrings != 0 {
				a.StringValues = d.strs()
			}
			if set&hasVersions != 0 {
				a.VersionValues = d.strs()
			}
			attrs[k] = a
		}
		out[i].attrs = attrs
	}
	if d.err == nil && len(d.s) != 0 {
		d.err = fmt.Errorf("packed form has %d bytes past its last device", len(d.s))
	}
	return out, d.err
}
