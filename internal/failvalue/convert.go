// Package failvalue is the one Go copy of the rules by which a failure
// given as a value (a host language's mapping, or a decoded JSON object)
// becomes a policy.Failure: which types each field takes, how numbers,
// hints and status names convert, and the messages every host gives
// byte for byte (testdata/vectors/README.md, "Field values"). The module
// (wasm: decide_value, outcome_value) reads a failure in the binary value
// encoding of Decode; the decide command and the vectors (internal/vector)
// convert decoded JSON with the same Convert.
//
// It imports neither encoding/json nor fmt: it is linked into
// backstop.wasm, whose size every host pays at start-up.
package failvalue

import (
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/backstop-dev/backstop/internal/abi"
	"github.com/backstop-dev/backstop/internal/grpccode"
	"github.com/backstop-dev/backstop/policy"
)

// A value is one of: nil, bool, Number, float64 (NaN, ±Inf too), string,
// []byte, []any (only described: "an array"), map[string]any, or Other.

// Number is a number literal as JSON writes it: an integer literal when it
// holds none of '.', 'e', 'E' (of any size: a Python int, a JavaScript
// BigInt), else a decimal read as the nearest float64.
type Number string

// Other is a value of a type no field takes, as the host describes it
// after "got " ("a timedelta"): only ever in a message.
type Other string

// MaxStringBytes is the longest method, error kind or hint, in UTF-8
// bytes (a batch record holds its lengths as u16).
const MaxStringBytes = abi.MaxString

// Convert converts a failure value to a policy.Failure, with the rules
// every host applies to the values its callers pass to decide.
//
// A field problem is a *policy.InputError naming the field. Unknown fields
// come first (the least name in code point order), then the fields in the
// order of Fields. The policy checks ranges afterwards.
func Convert(v any) (policy.Failure, error) {
	obj, ok := v.(map[string]any)
	if !ok {
		return policy.Failure{}, &policy.InputError{Field: "failure", Reason: "must be an object (got " + Describe(v) + ")"}
	}
	unknown, found := "", false
	for k := range obj {
		if !slices.Contains(Fields, k) && (!found || k < unknown) {
			unknown, found = k, true
		}
	}
	if found {
		return policy.Failure{}, &policy.InputError{Field: unknown, Reason: "unknown field"}
	}
	var f policy.Failure
	c := converter{obj: obj}
	c.fields(&f) // fields_gen.go: each field by its type, in the order of Fields
	if c.err != nil {
		return policy.Failure{}, c.err
	}
	return f, nil
}

// Int64 converts the value v of a field that takes integers only (as
// attempt does): nil is 0.
func Int64(field string, v any) (int64, error) {
	c := converter{obj: map[string]any{field: v}}
	n := c.int64(field, "must be an integer", false)
	if c.err != nil {
		return 0, c.err
	}
	return n, nil
}

// converter converts fields and keeps the first error.
type converter struct {
	obj map[string]any
	err error
}

func (c *converter) fail(field, reason string, v any) {
	if c.err == nil {
		if v != nil {
			reason += " (got " + Describe(v) + ")"
		}
		c.err = &policy.InputError{Field: field, Reason: reason}
	}
}

// get returns the field's value, nil when absent, null, or when an earlier
// field failed.
func (c *converter) get(field string) any {
	if c.err != nil {
		return nil
	}
	return c.obj[field]
}

// number is a numeric value: f is its float64; an integer literal is
// exact in i (isInt set) when it fits in 64 bits.
type number struct {
	f       float64
	i       int64
	isInt   bool // an integer literal
	fits    bool // an integer literal within int64
	literal string
}

func asNumber(v any) (number, bool) {
	switch x := v.(type) {
	case float64:
		return number{f: x}, true
	case Number:
		s := string(x)
		if !strings.ContainsAny(s, ".eE") {
			i, err := strconv.ParseInt(s, 10, 64)
			f, _ := strconv.ParseFloat(s, 64) // ±Inf when out of range
			return number{f: f, i: i, isInt: true, fits: err == nil, literal: s}, true
		}
		f, _ := strconv.ParseFloat(s, 64) // ±Inf past the float64 range, 0 below it
		return number{f: f}, true
	}
	return number{}, false
}

const two63 = 9223372036854775808.0

// int64 converts attempt (integers only) or a time (fractions truncated).
// A value that is not a number is refused with reason; a number that is
// not an integer (or a time that is not finite) with "must be an integer".
func (c *converter) int64(field, reason string, truncate bool) int64 {
	v := c.get(field)
	if v == nil {
		return 0
	}
	n, ok := asNumber(v)
	switch {
	case !ok:
		c.fail(field, reason, v)
	case math.IsNaN(n.f) || (!n.isInt && math.IsInf(n.f, 0)):
		c.fail(field, "must be an integer", v)
	case n.isInt:
		if !n.fits {
			c.fail(field, "must fit in 64 bits", v)
		}
		return n.i
	case !truncate && n.f != math.Trunc(n.f):
		c.fail(field, "must be an integer", v)
	case math.Trunc(n.f) >= two63 || math.Trunc(n.f) < -two63:
		c.fail(field, "must fit in 64 bits", v)
	default:
		return int64(math.Trunc(n.f))
	}
	return 0
}

// int32 converts http_status (and a numeric grpc_code): integers that fit
// in 32 bits.
func (c *converter) int32(field, reason string) int32 {
	v := c.get(field)
	if v == nil {
		return 0
	}
	n, ok := asNumber(v)
	switch {
	case n.isInt && n.fits && n.i == int64(int32(n.i)):
		return int32(n.i)
	case ok && !n.isInt && n.f == math.Trunc(n.f) && n.f >= math.MinInt32 && n.f <= math.MaxInt32:
		return int32(n.f)
	}
	c.fail(field, reason, v)
	return 0
}

// grpc converts grpc_code: a 32-bit integer, or a status name.
func (c *converter) grpc(field, reason string) int32 {
	if s, ok := c.get(field).(string); ok {
		if code, ok := GRPCCodeByName(s); ok {
			return int32(code)
		}
		c.fail(field, "unknown gRPC status name "+Quote(s), nil)
		return 0
	}
	return c.int32(field, reason)
}

// GRPCCodeByName returns the code of a gRPC status name, in any ASCII
// letter case ("unavailable"): only ASCII letters fold, so every host
// matches the same names.
func GRPCCodeByName(name string) (int, bool) {
	up := []byte(name)
	for i, b := range up {
		if b >= 0x80 {
			return 0, false
		}
		if 'a' <= b && b <= 'z' {
			up[i] = b - ('a' - 'A')
		}
	}
	names := grpccode.Names()
	i := slices.Index(names[:], string(up))
	return i, i >= 0
}

// str converts a string field: a string, or bytes as they are.
func (c *converter) str(field, reason string) string {
	switch x := c.get(field).(type) {
	case nil:
	case string:
		return c.sized(field, x)
	case []byte:
		return c.sized(field, string(x))
	default:
		c.fail(field, reason, x)
	}
	return ""
}

func (c *converter) sized(field, s string) string {
	if len(s) > MaxStringBytes {
		c.fail(field, "must be at most "+strconv.Itoa(MaxStringBytes)+" bytes (got "+strconv.Itoa(len(s))+")", nil)
		return ""
	}
	return s
}

// hint converts retry_after (seconds) or grpc_retry_pushback_ms
// (milliseconds): the raw value, or a number written as the integer it
// rounds up to ("NaN", "Infinity" or "-Infinity" when not finite: values
// the policy ignores as malformed).
func (c *converter) hint(field, reason string) string {
	v := c.get(field)
	if n, ok := asNumber(v); ok {
		return c.sized(field, hintNumber(n))
	}
	return c.str(field, reason)
}

func hintNumber(n number) string {
	switch {
	case n.isInt:
		return canonicalInt(n.literal)
	case math.IsNaN(n.f) || math.IsInf(n.f, 0):
		return ESFormat(n.f)
	}
	// An integral float64 in 'f' format with no fraction digits is its
	// exact value in decimal (strconv is exact at a given precision).
	s := strconv.FormatFloat(math.Ceil(n.f), 'f', 0, 64)
	if s == "-0" {
		return "0"
	}
	return s
}

// key converts idempotency_key: a string (present when not empty) or a
// boolean. true is kept as "true".
func (c *converter) key(field, reason string) string {
	switch x := c.get(field).(type) {
	case nil:
	case bool:
		if x {
			return "true"
		}
	case string:
		return x
	case []byte:
		return string(x)
	default:
		c.fail(field, reason, x)
	}
	return ""
}

// boolean converts retried_downstream and server_declined: true, false or
// absent. Nothing else is read as a flag (not 1, not "true"): a caller
// that sends one has a bug worth hearing about.
func (c *converter) boolean(field, reason string) bool {
	switch x := c.get(field).(type) {
	case nil:
	case bool:
		return x
	default:
		c.fail(field, reason, x)
	}
	return false
}

// random converts random: a number, or "NaN", "Infinity" (also
// "+Infinity") or "-Infinity" as a string.
func (c *converter) random(field, reason string) float64 {
	v := c.get(field)
	if v == nil {
		return 0
	}
	if n, ok := asNumber(v); ok {
		return n.f
	}
	switch v {
	case "NaN":
		return math.NaN()
	case "Infinity", "+Infinity":
		return math.Inf(1)
	case "-Infinity":
		return math.Inf(-1)
	}
	c.fail(field, reason, v)
	return 0
}

// Describe is how an error message shows a value that has the wrong type
// or range, the same in every host: true, false, null, a number (as
// JavaScript prints it: ESFormat), an integer in full, or "a string",
// "bytes", "an array", "an object", or an Other's own words.
func Describe(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case bool:
		return strconv.FormatBool(x)
	case float64:
		return ESFormat(x)
	case Number:
		if n, _ := asNumber(x); n.isInt {
			return canonicalInt(n.literal)
		} else {
			return ESFormat(n.f)
		}
	case string:
		return "a string"
	case []byte:
		return "bytes"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	case Other:
		return string(x)
	}
	return "a value of an unknown type"
}

func canonicalInt(literal string) string {
	if literal == "-0" {
		return "0"
	}
	return literal
}

// ESFormat formats f as ECMAScript's Number::toString does (also RFC 8785
// JSON canonicalization): the shortest digits that round-trip, in plain
// notation from 1e-7 to 1e21, else with an exponent ("1e+21", "1.5e-7").
func ESFormat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	case f == 0:
		return "0"
	case f < 0:
		return "-" + ESFormat(-f)
	}
	s := strconv.FormatFloat(f, 'e', -1, 64) // d.ddde±x
	mant, exp, _ := strings.Cut(s, "e")
	digits := strings.Replace(mant, ".", "", 1)
	e, _ := strconv.Atoi(exp)
	k, n := len(digits), e+1
	switch {
	case k <= n && n <= 21:
		return digits + strings.Repeat("0", n-k)
	case 0 < n && n <= 21:
		return digits[:n] + "." + digits[n:]
	case -6 < n && n <= 0:
		return "0." + strings.Repeat("0", -n) + digits
	}
	sign := "+"
	if n-1 < 0 {
		sign = "-"
	}
	m := digits[:1]
	if k > 1 {
		m += "." + digits[1:]
	}
	return m + "e" + sign + strconv.Itoa(abs(n-1))
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// Quote writes s as a JSON string the way every host's messages do: '"'
// and '\' escaped, control characters as \b \f \n \r \t or \u00xx, U+2028
// and U+2029 as \u2028 and \u2029, everything else as is.
func Quote(s string) string {
	const hexDigits = "0123456789abcdef"
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			if r < 0x20 || r == '\u2028' || r == '\u2029' {
				b.WriteString(`\u`)
				for shift := 12; shift >= 0; shift -= 4 {
					b.WriteByte(hexDigits[r>>shift&0xf])
				}
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}
