// Package failvalue is the one Go copy of the rules by which a failure
// given as a value (a host language's mapping, or a decoded JSON object)
// becomes a policy.Failure: which types each field takes, how numbers,
// hints and status names convert, and the messages every host gives
// byte for byte (testdata/vectors/README.md, "Field values"). The module
// (wasm: decide_value, outcome_value) reads a failure in the binary value
// encoding with DecodeFailure, which allocates nothing for a valid one;
// Decode reads the same encoding into a value; the decide command and the
// vectors (internal/vector) convert decoded JSON with Convert. All three go
// through the same converters.
//
// It imports neither encoding/json nor fmt: it is linked into
// backstop.wasm, whose size every host pays at start-up.
package failvalue

import (
	"math"
	"strconv"
	"strings"

	"github.com/backstop-dev/backstop/internal/abi"
	"github.com/backstop-dev/backstop/internal/grpccode"
	"github.com/backstop-dev/backstop/policy"
)

// A value is one of: nil, bool, Number, float64 (NaN, ±Inf too), string,
// []byte, []any (only described: "an array"), map[string]any, or Other.
// The converters read each as a val, which boxes nothing: DecodeFailure
// reads a failure from the value encoding without allocating.

// val is one value of a failure's field, by its tag (abi.Value*, or
// valUnknown): an integer's literal, a string, bytes or an Other's words
// in s (aliasing the encoding when decoded), a float in f, an object that
// Decode builds in m.
type val struct {
	kind byte
	s    string
	f    float64
	m    map[string]any
}

// valUnknown is the kind of a Go value of no type above.
const valUnknown = 0xff

// toVal is v as a val. A Number with a fraction or an exponent is the
// float64 it reads as (Append encodes it so).
func toVal(v any) val {
	switch x := v.(type) {
	case nil:
		return val{}
	case bool:
		if x {
			return val{kind: abi.ValueTrue}
		}
		return val{kind: abi.ValueFalse}
	case Number:
		s := string(x)
		if strings.ContainsAny(s, ".eE") {
			f, _ := strconv.ParseFloat(s, 64) // ±Inf past the float64 range, 0 below it
			return val{kind: abi.ValueFloat, f: f}
		}
		return val{kind: abi.ValueInt, s: s}
	case float64:
		return val{kind: abi.ValueFloat, f: x}
	case string:
		return val{kind: abi.ValueString, s: x}
	case []byte:
		return val{kind: abi.ValueBytes, s: string(x)}
	case []any:
		return val{kind: abi.ValueArray}
	case map[string]any:
		return val{kind: abi.ValueObject, m: x}
	case Other:
		return val{kind: abi.ValueOther, s: string(x)}
	}
	return val{kind: valUnknown}
}

// any is v as Decode returns it, with strings of its own.
func (v val) any() any {
	switch v.kind {
	case abi.ValueFalse:
		return false
	case abi.ValueTrue:
		return true
	case abi.ValueInt:
		return Number(strings.Clone(v.s))
	case abi.ValueFloat:
		return v.f
	case abi.ValueString:
		return strings.Clone(v.s)
	case abi.ValueBytes:
		return []byte(v.s)
	case abi.ValueArray:
		return []any{}
	case abi.ValueObject:
		return v.m
	case abi.ValueOther:
		return Other(strings.Clone(v.s))
	}
	return nil
}

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
		if fieldIndex(k) < 0 && (!found || k < unknown) {
			unknown, found = k, true
		}
	}
	if found {
		return policy.Failure{}, &policy.InputError{Field: unknown, Reason: "unknown field"}
	}
	var vals [nFields]val
	for k, x := range obj {
		vals[fieldIndex(k)] = toVal(x)
	}
	var f policy.Failure
	err := convert(&vals, &f)
	return f, err
}

// convert converts the values of a failure's fields (indexed as Fields;
// null when absent), after the unknown fields were checked, into f (zero:
// the fields absent stay so). On an error f is zero again. Pointers in and
// nothing but the error out: Go's wasm code copies a struct of more than
// 16 bytes with memory.copy, which wazero makes a call.
func convert(vals *[nFields]val, f *policy.Failure) error {
	var c converter
	c.fields(f, vals) // fields_gen.go: each field by its type, in the order of Fields
	if c.err != nil {
		*f = policy.Failure{}
	}
	return c.err
}

// Int64 converts the value v of a field that takes integers only (as
// attempt does): nil is 0.
func Int64(field string, v any) (int64, error) {
	var c converter
	x := toVal(v)
	n := c.int64(field, &x, "must be an integer", false)
	if c.err != nil {
		return 0, c.err
	}
	return n, nil
}

// converter converts fields and keeps the first error. It holds no
// values: escape analysis would see them flow into the error and move
// them to the heap.
type converter struct {
	err error
}

// fail records the first error; v is described after "got" unless null.
func (c *converter) fail(field, reason string, v *val) {
	if c.err == nil {
		if v != nil {
			reason += " (got " + describe(*v) + ")"
		}
		c.err = &policy.InputError{Field: field, Reason: reason}
	}
}

// The kinds of number asNumber finds.
const (
	notNumber = iota
	isFloat   // a float
	isInt     // an integer literal within int64
	isBigInt  // an integer literal past int64
)

// asNumber reads a numeric value: f is its float64, i exact when an integer
// literal fits in 64 bits (an integer's literal is v.s). It returns
// scalars, not a struct: Go's wasm code copies a struct of more than 16
// bytes with memory.copy, which wazero makes a call.
func asNumber(v *val) (f float64, i int64, kind int) {
	switch v.kind {
	case abi.ValueFloat:
		return v.f, 0, isFloat
	case abi.ValueInt: // an integer literal (toVal makes any other a float)
		s := v.s
		i, ok := smallInt(s)
		if !ok {
			var err error
			i, err = strconv.ParseInt(s, 10, 64)
			ok = err == nil
		}
		f, kind = float64(i), isInt
		// float64(i) rounds as ParseFloat does, except "-0" (-0.0) and
		// literals past int64 (±Inf): parse only those.
		if !ok {
			kind = isBigInt
		}
		if !ok || (i == 0 && len(s) > 0 && s[0] == '-') {
			f, _ = strconv.ParseFloat(s, 64) // ±Inf when out of range
		}
		return f, i, kind
	}
	return 0, 0, notNumber
}

// smallInt is strconv.ParseInt(s, 10, 64) for at most 18 digits (which
// fit), without its calls: ok is false for anything else.
func smallInt(s string) (int64, bool) {
	digits := s
	if len(s) > 0 && s[0] == '-' {
		digits = s[1:]
	}
	if len(digits) == 0 || len(digits) > 18 {
		return 0, false
	}
	var n int64
	for i := 0; i < len(digits); i++ {
		c := digits[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if len(digits) < len(s) {
		n = -n
	}
	return n, true
}

const two63 = 9223372036854775808.0

// int64 converts attempt (integers only) or a time (fractions truncated).
// A value that is not a number is refused with reason; a number that is
// not an integer (or a time that is not finite) with "must be an integer".
func (c *converter) int64(field string, v *val, reason string, truncate bool) int64 {
	if v.kind == abi.ValueNull {
		return 0
	}
	f, i, kind := asNumber(v)
	switch {
	case kind == notNumber:
		c.fail(field, reason, v)
	case math.IsNaN(f) || (kind == isFloat && math.IsInf(f, 0)):
		c.fail(field, "must be an integer", v)
	case kind != isFloat:
		if kind == isBigInt {
			c.fail(field, "must fit in 64 bits", v)
		}
		return i
	case !truncate && f != math.Trunc(f):
		c.fail(field, "must be an integer", v)
	case math.Trunc(f) >= two63 || math.Trunc(f) < -two63:
		c.fail(field, "must fit in 64 bits", v)
	default:
		return int64(math.Trunc(f))
	}
	return 0
}

// int32 converts http_status (and a numeric grpc_code): integers that fit
// in 32 bits.
func (c *converter) int32(field string, v *val, reason string) int32 {
	if v.kind == abi.ValueNull {
		return 0
	}
	f, i, kind := asNumber(v)
	switch {
	case kind == isInt && i == int64(int32(i)):
		return int32(i)
	case kind == isFloat && f == math.Trunc(f) && f >= math.MinInt32 && f <= math.MaxInt32:
		return int32(f)
	}
	c.fail(field, reason, v)
	return 0
}

// grpc converts grpc_code: a 32-bit integer, or a status name.
func (c *converter) grpc(field string, v *val, reason string) int32 {
	if v.kind == abi.ValueString {
		if code, ok := GRPCCodeByName(v.s); ok {
			return int32(code)
		}
		c.fail(field, "unknown gRPC status name "+Quote(v.s), nil)
		return 0
	}
	return c.int32(field, v, reason)
}

// GRPCCodeByName returns the code of a gRPC status name, in any ASCII
// letter case ("unavailable"): only ASCII letters fold, so every host
// matches the same names.
func GRPCCodeByName(name string) (int, bool) {
	for code, upper := range grpccode.Names() {
		if upperASCII(name, upper) {
			return code, true
		}
	}
	return 0, false
}

// upperASCII reports whether s is upper (an ASCII name in upper case) with
// its ASCII letters in any case. A byte past ASCII matches no name's byte.
func upperASCII(s, upper string) bool {
	if len(s) != len(upper) {
		return false
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		if 'a' <= b && b <= 'z' {
			b -= 'a' - 'A'
		}
		if b != upper[i] {
			return false
		}
	}
	return true
}

// str converts a string field: a string, or bytes as they are.
func (c *converter) str(field string, v *val, reason string) string {
	switch v.kind {
	case abi.ValueNull:
	case abi.ValueString, abi.ValueBytes:
		return c.sized(field, v.s)
	default:
		c.fail(field, reason, v)
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
func (c *converter) hint(field string, v *val, reason string) string {
	if f, _, kind := asNumber(v); kind == isFloat {
		return c.sized(field, hintNumber(f))
	} else if kind != notNumber {
		return c.sized(field, canonicalInt(v.s))
	}
	return c.str(field, v, reason)
}

// hintNumber writes a float hint as the integer it rounds up to.
func hintNumber(f float64) string {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return ESFormat(f)
	}
	// An integral float64 in 'f' format with no fraction digits is its
	// exact value in decimal (strconv is exact at a given precision).
	s := strconv.FormatFloat(math.Ceil(f), 'f', 0, 64)
	if s == "-0" {
		return "0"
	}
	return s
}

// key converts idempotency_key: a string (present when not empty) or a
// boolean. true is kept as "true".
func (c *converter) key(field string, v *val, reason string) string {
	switch v.kind {
	case abi.ValueNull, abi.ValueFalse:
	case abi.ValueTrue:
		return "true"
	case abi.ValueString, abi.ValueBytes:
		return v.s
	default:
		c.fail(field, reason, v)
	}
	return ""
}

// boolean converts retried_downstream and server_declined: true, false or
// absent. Nothing else is read as a flag (not 1, not "true"): a caller
// that sends one has a bug worth hearing about.
func (c *converter) boolean(field string, v *val, reason string) bool {
	switch v.kind {
	case abi.ValueNull, abi.ValueFalse:
	case abi.ValueTrue:
		return true
	default:
		c.fail(field, reason, v)
	}
	return false
}

// random converts random: a number, or "NaN", "Infinity" (also
// "+Infinity") or "-Infinity" as a string.
func (c *converter) random(field string, v *val, reason string) float64 {
	if v.kind == abi.ValueNull {
		return 0
	}
	if f, _, kind := asNumber(v); kind != notNumber {
		return f
	}
	if v.kind == abi.ValueString {
		switch v.s {
		case "NaN":
			return math.NaN()
		case "Infinity", "+Infinity":
			return math.Inf(1)
		case "-Infinity":
			return math.Inf(-1)
		}
	}
	c.fail(field, reason, v)
	return 0
}

// Describe is how an error message shows a value that has the wrong type
// or range, the same in every host: true, false, null, a number (as
// JavaScript prints it: ESFormat), an integer in full, or "a string",
// "bytes", "an array", "an object", or an Other's own words.
func Describe(v any) string { return describe(toVal(v)) }

func describe(v val) string {
	switch v.kind {
	case abi.ValueNull:
		return "null"
	case abi.ValueFalse:
		return "false"
	case abi.ValueTrue:
		return "true"
	case abi.ValueFloat:
		return ESFormat(v.f)
	case abi.ValueInt:
		return canonicalInt(v.s)
	case abi.ValueString:
		return "a string"
	case abi.ValueBytes:
		return "bytes"
	case abi.ValueArray:
		return "an array"
	case abi.ValueObject:
		return "an object"
	case abi.ValueOther:
		return v.s
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
