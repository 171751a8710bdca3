package failvalue

import (
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
	"unsafe"

	"github.com/backstop-dev/backstop/internal/abi"
	"github.com/backstop-dev/backstop/policy"
)

// The binary value encoding (wasm/ABI.md, "decide_value"): a tag byte and
// its payload, integers little-endian. The tags are contract/abi.json's
// values table (abi.Value*).

// MaxDepth is the deepest nesting of objects Decode reads (the failure
// object itself is depth 1), as for a decide input line: nested objects
// are only described, and the bound keeps decoding's stack small.
const MaxDepth = 32

// Decode reads the one value in b, which must hold nothing else. A
// malformed encoding is a *policy.InputError for the field "value" (its
// message "invalid failure: value: …"). It never panics: every length is
// checked against what is left before anything is read or allocated.
func Decode(b []byte) (any, error) {
	d := decoder{b: b, build: true}
	var v val
	d.value(1, &v)
	if err := d.end(); err != nil {
		return nil, err
	}
	return v.any(), nil
}

// DecodeFailure reads the failure in b and converts it into f, which
// must be zero: what Convert makes of what Decode reads, without building
// the value (on an error f is left zero). A valid failure allocates
// nothing: its strings alias b, so b must not change while f is in use.
// malformed says err is the encoding's (field "value"), not the caller's.
func DecodeFailure(b []byte, f *policy.Failure) (malformed bool, err error) {
	d := decoder{b: b}
	var vals [nFields]val
	var top val
	unknown, found := d.failure(&vals, &top)
	if err := d.end(); err != nil {
		return true, err
	}
	switch {
	case top.kind != abi.ValueObject:
		return false, &policy.InputError{Field: "failure", Reason: "must be an object (got " + describe(top) + ")"}
	case found:
		return false, &policy.InputError{Field: strings.Clone(unknown), Reason: "unknown field"}
	}
	return false, convert(&vals, f)
}

type decoder struct {
	b     []byte
	off   int
	err   string // the first problem, with the offset where it was found
	build bool   // Decode: objects become maps, nested ones in full
}

// end checks that the value read was all of b: nil, or the encoding's error.
func (d *decoder) end() error {
	if d.err == "" && d.off != len(d.b) {
		d.fail(strconv.Itoa(len(d.b)-d.off) + " bytes after the value")
	}
	if d.err != "" {
		return &policy.InputError{Field: "value", Reason: d.err}
	}
	return nil
}

func (d *decoder) fail(reason string) {
	if d.err == "" {
		d.err = reason + " at byte " + strconv.Itoa(d.off)
	}
}

// The readers below are small enough to inline, with their messages built
// out of line only on an error: a call costs tens of ns in Go's wasm code,
// and a failure value is a few dozen of them.

// take returns the next n bytes, or nil (and an error: what+suffix runs
// past the end) past the end.
func (d *decoder) take(n int, what, suffix string) []byte {
	if d.err == "" && n >= 0 && n <= len(d.b)-d.off {
		s := d.b[d.off : d.off+n]
		d.off += n
		return s
	}
	d.pastEnd(what, suffix)
	return nil
}

func (d *decoder) pastEnd(what, suffix string) {
	if d.err == "" {
		d.fail(what + suffix + " runs past the end")
	}
}

// length reads a u32 length, returned as an int that fits what is left
// (each item is at least minSize bytes), or -1 after an error.
func (d *decoder) length(what string, minSize int) int {
	p := d.take(4, what, " length")
	if p == nil {
		return -1
	}
	n := binary.LittleEndian.Uint32(p)
	if uint64(n)*uint64(minSize) > uint64(len(d.b)-d.off) {
		d.tooLong(what, n)
		return -1
	}
	return int(n)
}

func (d *decoder) tooLong(what string, n uint32) {
	d.off -= 4
	d.fail(what + " length " + strconv.FormatUint(uint64(n), 10) + " runs past the end")
}

// text reads a length and that many bytes of UTF-8: a string that aliases
// b (val.any copies it for Decode). The common case, ASCII inside b, is
// read here in one call; textSlow reads every other, with its errors.
func (d *decoder) text(what string) string {
	b, off := d.b, d.off
	if d.err == "" && len(b)-off >= 4 {
		n := int(binary.LittleEndian.Uint32(b[off:]))
		if n <= len(b)-off-4 {
			p := b[off+4 : off+4+n]
			ascii := true
			for _, c := range p {
				ascii = ascii && c < 0x80
			}
			if ascii {
				d.off = off + 4 + n
				return unsafe.String(unsafe.SliceData(p), n)
			}
		}
	}
	return d.textSlow(what)
}

func (d *decoder) textSlow(what string) string {
	n := d.length(what, 1)
	p := d.take(n, what, "")
	if len(p) == 0 {
		return ""
	}
	if !validUTF8(p) {
		d.notUTF8(what, n)
		return ""
	}
	return unsafe.String(&p[0], len(p))
}

// validUTF8 is utf8.Valid with ASCII, every key and nearly every string,
// checked inline.
func validUTF8(p []byte) bool {
	for _, c := range p {
		if c >= 0x80 {
			return utf8.Valid(p)
		}
	}
	return true
}

func (d *decoder) notUTF8(what string, n int) {
	d.off -= n
	d.fail(what + " is not UTF-8")
}

// value reads one value into v (zero: null, on an error too).
func (d *decoder) value(depth int, v *val) {
	tag := d.take(1, "a value", "")
	if tag == nil {
		return
	}
	switch t := tag[0]; t {
	case abi.ValueNull, abi.ValueFalse, abi.ValueTrue, abi.ValueArray:
		v.kind = t
	case abi.ValueInt:
		v.kind, v.s = t, d.text("an integer")
		if d.err == "" && !isInteger(v.s) {
			d.fail("an integer is not a decimal integer")
		}
	case abi.ValueFloat:
		if p := d.take(8, "a float", ""); p != nil {
			v.kind, v.f = t, math.Float64frombits(binary.LittleEndian.Uint64(p))
		}
	case abi.ValueString:
		v.kind, v.s = t, d.text("a string")
	case abi.ValueBytes:
		n := d.length("bytes", 1)
		v.kind = t
		if p := d.take(n, "bytes", ""); len(p) > 0 {
			v.s = unsafe.String(&p[0], len(p))
		}
	case abi.ValueObject:
		if depth > MaxDepth {
			d.off--
			d.fail("objects nested deeper than " + strconv.Itoa(MaxDepth) + " levels")
			return
		}
		v.kind, v.m = t, d.object(depth)
	case abi.ValueOther:
		v.kind, v.s = t, d.text("a description")
	default:
		d.off--
		d.fail("unknown tag " + strconv.Itoa(int(t)))
	}
}

// object reads an object's count and entries: a map when building, else
// nil (an object is only described), its keys still checked for
// duplicates.
func (d *decoder) object(depth int) map[string]any {
	n := d.length("an object", 5) // a key's length and a tag at least
	if n < 0 {
		return nil
	}
	var m map[string]any
	var keys keySet
	if d.build {
		m = make(map[string]any, min(n, 64))
	}
	for range n {
		at := d.off
		k := d.text("a key")
		if d.err != "" {
			return nil
		}
		if keys.add(k) {
			d.dup(k, at)
			return nil
		}
		var v val
		d.value(depth+1, &v)
		if d.build {
			m[strings.Clone(k)] = v.any()
		}
	}
	return m
}

// failure reads the value in b, the failure: an object's fields go to
// vals (indexed as Fields); of its other keys, the least is returned.
func (d *decoder) failure(vals *[nFields]val, top *val) (unknown string, found bool) {
	if len(d.b) == 0 || d.b[0] != abi.ValueObject {
		d.value(1, top)
		return "", false
	}
	d.off++
	n := d.length("an object", 5)
	if n < 0 {
		return "", false
	}
	var seen uint64    // the fields read, by index (nFields <= 64: fieldsFit)
	var others *keySet // made on the first unknown key, which is rare
	for range n {
		at := d.off
		k := d.text("a key")
		if d.err != "" {
			return "", false
		}
		i := fieldIndex(k)
		var dup bool
		if i >= 0 {
			dup, seen = seen&(1<<i) != 0, seen|1<<i
		} else {
			if others == nil {
				others = new(keySet)
			}
			dup = others.add(k)
		}
		if dup {
			d.dup(k, at)
			return "", false
		}
		if i >= 0 {
			d.value(2, &vals[i])
			continue
		}
		var v val
		d.value(2, &v)
		if !found || k < unknown {
			unknown, found = k, true
		}
	}
	top.kind = abi.ValueObject
	return unknown, found
}

// fieldsFit fails to compile when a failure has more fields than failure's
// seen has bits.
var _ [64 - nFields]struct{}

// dup fails on a duplicate key k read at offset at.
func (d *decoder) dup(k string, at int) {
	d.off = at
	d.fail("duplicate key " + Quote(k))
}

// keySet is the keys of one object, for finding duplicates: the first few
// in an array (no allocation for any ordinary failure), then in a map.
type keySet struct {
	small [16]string
	n     int
	m     map[string]struct{}
}

// add adds k and reports whether it was there already.
func (s *keySet) add(k string) bool {
	if s.m == nil {
		for _, x := range s.small[:s.n] {
			if x == k {
				return true
			}
		}
		if s.n < len(s.small) {
			s.small[s.n] = k
			s.n++
			return false
		}
		s.m = make(map[string]struct{}, 2*len(s.small))
		for _, x := range s.small {
			s.m[x] = struct{}{}
		}
	}
	if _, ok := s.m[k]; ok {
		return true
	}
	s.m[k] = struct{}{}
	return false
}

// isInteger reports whether s is a decimal integer: an optional '-', then
// one digit or more.
func isInteger(s string) bool {
	if len(s) > 0 && s[0] == '-' {
		s = s[1:]
	}
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// Append appends the encoding of v to dst: nil, bool, Number (an integer
// literal as tag int, another as the float64 it reads as), int, int64,
// float64, string, []byte, []any, map[string]any (keys sorted, so the
// bytes are reproducible; nested objects in full) or Other. A host SDK
// does the same in its language; Go's own callers have policy.Failure.
func Append(dst []byte, v any) ([]byte, error) {
	switch x := v.(type) {
	case nil:
		return append(dst, abi.ValueNull), nil
	case bool:
		if x {
			return append(dst, abi.ValueTrue), nil
		}
		return append(dst, abi.ValueFalse), nil
	case Number:
		if v := toVal(x); v.kind == abi.ValueFloat {
			return Append(dst, v.f)
		}
		if !isInteger(string(x)) {
			return nil, errors.New("failvalue: not a number: " + string(x))
		}
		return appendText(append(dst, abi.ValueInt), string(x)), nil
	case int:
		return appendText(append(dst, abi.ValueInt), strconv.Itoa(x)), nil
	case int64:
		return appendText(append(dst, abi.ValueInt), strconv.FormatInt(x, 10)), nil
	case float64:
		return binary.LittleEndian.AppendUint64(append(dst, abi.ValueFloat), math.Float64bits(x)), nil
	case string:
		return appendText(append(dst, abi.ValueString), x), nil
	case []byte:
		return append(appendLen(append(dst, abi.ValueBytes), len(x)), x...), nil
	case []any:
		return append(dst, abi.ValueArray), nil
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		dst = appendLen(append(dst, abi.ValueObject), len(keys))
		var err error
		for _, k := range keys {
			if dst, err = Append(appendText(dst, k), x[k]); err != nil {
				return nil, err
			}
		}
		return dst, nil
	case Other:
		return appendText(append(dst, abi.ValueOther), string(x)), nil
	}
	return nil, errors.New("failvalue: a value of an unknown type: " + Describe(v))
}

func appendLen(dst []byte, n int) []byte {
	return binary.LittleEndian.AppendUint32(dst, uint32(n))
}

func appendText(dst []byte, s string) []byte {
	return append(appendLen(dst, len(s)), s...)
}
