package failvalue

import (
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"strconv"
	"unicode/utf8"

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
	d := decoder{b: b}
	v := d.value(1)
	if d.err == "" && d.off != len(b) {
		d.fail(strconv.Itoa(len(b)-d.off) + " bytes after the value")
	}
	if d.err != "" {
		return nil, &policy.InputError{Field: "value", Reason: d.err}
	}
	return v, nil
}

type decoder struct {
	b   []byte
	off int
	err string // the first problem, with the offset where it was found
}

func (d *decoder) fail(reason string) {
	if d.err == "" {
		d.err = reason + " at byte " + strconv.Itoa(d.off)
	}
}

// take returns the next n bytes, or nil (and an error) past the end.
func (d *decoder) take(n int, what string) []byte {
	if d.err != "" {
		return nil
	}
	if n < 0 || n > len(d.b)-d.off {
		d.fail(what + " runs past the end")
		return nil
	}
	s := d.b[d.off : d.off+n]
	d.off += n
	return s
}

// length reads a u32 length, returned as an int that fits what is left
// (each item is at least minSize bytes), or -1 after an error.
func (d *decoder) length(what string, minSize int) int {
	p := d.take(4, what+" length")
	if p == nil {
		return -1
	}
	n := binary.LittleEndian.Uint32(p)
	if uint64(n)*uint64(minSize) > uint64(len(d.b)-d.off) {
		d.off -= 4
		d.fail(what + " length " + strconv.FormatUint(uint64(n), 10) + " runs past the end")
		return -1
	}
	return int(n)
}

func (d *decoder) text(what string) string {
	n := d.length(what, 1)
	p := d.take(n, what)
	if p == nil {
		return ""
	}
	if !utf8.Valid(p) {
		d.off -= n
		d.fail(what + " is not UTF-8")
		return ""
	}
	return string(p)
}

func (d *decoder) value(depth int) any {
	tag := d.take(1, "a value")
	if tag == nil {
		return nil
	}
	switch tag[0] {
	case abi.ValueNull:
		return nil
	case abi.ValueFalse:
		return false
	case abi.ValueTrue:
		return true
	case abi.ValueInt:
		s := d.text("an integer")
		if d.err == "" && !isInteger(s) {
			d.fail("an integer is not a decimal integer")
		}
		return Number(s)
	case abi.ValueFloat:
		if p := d.take(8, "a float"); p != nil {
			return math.Float64frombits(binary.LittleEndian.Uint64(p))
		}
		return nil
	case abi.ValueString:
		return d.text("a string")
	case abi.ValueBytes:
		n := d.length("bytes", 1)
		return slices.Clone(d.take(n, "bytes"))
	case abi.ValueArray:
		return []any{}
	case abi.ValueObject:
		if depth > MaxDepth {
			d.off--
			d.fail("objects nested deeper than " + strconv.Itoa(MaxDepth) + " levels")
			return nil
		}
		n := d.length("an object", 5) // a key's length and a tag at least
		if n < 0 {
			return nil
		}
		m := make(map[string]any, min(n, 64))
		for range n {
			at := d.off
			k := d.text("a key")
			if d.err != "" {
				return nil
			}
			if _, dup := m[k]; dup {
				d.off = at
				d.fail("duplicate key " + Quote(k))
				return nil
			}
			m[k] = d.value(depth + 1)
		}
		return m
	case abi.ValueOther:
		return Other(d.text("a description"))
	}
	d.off--
	d.fail("unknown tag " + strconv.Itoa(int(tag[0])))
	return nil
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
		if n, _ := asNumber(x); !n.isInt {
			return Append(dst, n.f)
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
