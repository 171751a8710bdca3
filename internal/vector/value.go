package vector

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"slices"
	"strconv"
	"strings"

	"github.com/backstop-dev/backstop/internal/grpccode"
	"github.com/backstop-dev/backstop/policy"
)

// Fields are the failure fields in the order every host checks them: the
// first invalid one (after unknown fields) is the one reported.
var Fields = []string{
	"attempt", "http_status", "grpc_code", "error_kind", "retry_after", "grpc_retry_pushback_ms",
	"method", "idempotency_key", "elapsed_ms", "now_ms", "random", "prev_delay_ms",
	"retried_downstream", "server_declined",
}

// FromValue converts a failure given as a JSON value to an Input, with the
// rules every host applies to the values its callers pass to decide
// (testdata/vectors/README.md, "Field values"). v comes from a decoder
// with UseNumber: nil, bool, json.Number, string, []any, map[string]any;
// also float64 (NaN, ±Inf) and []byte (bytes), which hosts' languages have
// and JSON does not (see Revive).
//
// A field problem is a *policy.InputError naming the field. Unknown fields
// come first (the least name in code point order), then the fields in the
// order of Fields. The module checks ranges afterwards.
func FromValue(v any) (Input, error) {
	obj, ok := v.(map[string]any)
	if !ok {
		return Input{}, &policy.InputError{Field: "failure", Reason: "must be an object (got " + Describe(v) + ")"}
	}
	var unknown []string
	for k := range obj {
		if !slices.Contains(Fields, k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		return Input{}, &policy.InputError{Field: slices.Min(unknown), Reason: "unknown field"}
	}
	var in Input
	var err error
	c := converter{obj: obj}
	in.Attempt = c.int64("attempt", false)
	in.HTTPStatus = int(c.int32("http_status", "must be a 32-bit integer"))
	in.GRPCCode = GRPCCode(c.grpc())
	in.ErrorKind = c.str("error_kind")
	in.RetryAfter = c.hint("retry_after")
	in.RetryPushback = c.hint("grpc_retry_pushback_ms")
	in.Method = c.str("method")
	in.IdempotencyKey = c.key()
	in.ElapsedMs = c.int64("elapsed_ms", true)
	in.NowMs = c.int64("now_ms", true)
	in.Random = Float(c.random())
	in.PrevDelayMs = c.int64("prev_delay_ms", true)
	in.RetriedDownstream = c.boolean("retried_downstream")
	in.ServerDeclined = c.boolean("server_declined")
	if c.err != nil {
		err = c.err
		in = Input{}
	}
	return in, err
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

// number returns v as a float64 when it is a number: ok is false for
// other types. An integer literal is exact in i (isInt set) when it fits
// in 64 bits.
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
	case json.Number:
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
func (c *converter) int64(field string, truncate bool) int64 {
	v := c.get(field)
	if v == nil {
		return 0
	}
	n, ok := asNumber(v)
	switch {
	case !ok || math.IsNaN(n.f) || (!n.isInt && math.IsInf(n.f, 0)):
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

func (c *converter) grpc() int32 {
	if s, ok := c.get("grpc_code").(string); ok {
		if code, ok := GRPCCodeByName(s); ok {
			return int32(code)
		}
		c.fail("grpc_code", "unknown gRPC status name "+Quote(s), nil)
		return 0
	}
	return c.int32("grpc_code", "must be a 32-bit integer or a status name")
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

func (c *converter) str(field string) string {
	switch x := c.get(field).(type) {
	case nil:
	case string:
		return c.sized(field, x)
	case []byte:
		return c.sized(field, string(x))
	default:
		c.fail(field, "must be a string", x)
	}
	return ""
}

func (c *converter) sized(field, s string) string {
	if len(s) > MaxStringBytes {
		c.fail(field, fmt.Sprintf("must be at most %d bytes (got %d)", MaxStringBytes, len(s)), nil)
		return ""
	}
	return s
}

// hint converts retry_after (seconds) or grpc_retry_pushback_ms
// (milliseconds): the raw value, or a number written as the integer it
// rounds up to ("NaN", "Infinity" or "-Infinity" when not finite: values
// the policy ignores as malformed).
func (c *converter) hint(field string) string {
	v := c.get(field)
	if n, ok := asNumber(v); ok {
		return c.sized(field, hintNumber(n))
	}
	if _, ok := v.(bool); ok {
		c.fail(field, "must be a string or a number", v)
		return ""
	}
	switch v.(type) {
	case []any, map[string]any:
		c.fail(field, "must be a string or a number", v)
		return ""
	}
	return c.str(field)
}

func hintNumber(n number) string {
	switch {
	case n.isInt:
		return canonicalInt(n.literal)
	case math.IsNaN(n.f) || math.IsInf(n.f, 0):
		return ESFormat(n.f)
	}
	i, _ := new(big.Float).SetFloat64(math.Ceil(n.f)).Int(nil)
	return i.String()
}

// key converts idempotency_key: a string (present when not empty) or a
// boolean. true is kept as "true".
func (c *converter) key() string {
	switch x := c.get("idempotency_key").(type) {
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
		c.fail("idempotency_key", "must be a string or a boolean", x)
	}
	return ""
}

// boolean converts retried_downstream and server_declined: true, false or
// absent. Nothing else is read as a flag (not 1, not "true"): a caller
// that sends one has a bug worth hearing about.
func (c *converter) boolean(field string) bool {
	switch x := c.get(field).(type) {
	case nil:
	case bool:
		return x
	default:
		c.fail(field, "must be a boolean", x)
	}
	return false
}

func (c *converter) random() float64 {
	v := c.get("random")
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
	c.fail("random", `must be a number, "NaN", "Infinity" or "-Infinity"`, v)
	return 0
}

// Describe is how an error message shows a value that has the wrong type
// or range, the same in every host: true, false, null, a number (as
// JavaScript prints it: ESFormat), an integer in full, or "a string",
// "bytes", "an array", "an object".
func Describe(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case bool:
		return strconv.FormatBool(x)
	case float64:
		return ESFormat(x)
	case json.Number:
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
	}
	return fmt.Sprintf("a %T", v)
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
		case '\u2028', '\u2029':
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			if r < 0x20 {
				fmt.Fprintf(&b, `\u%04x`, r)
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}

// Revive replaces the tags of library-only values in a decoded JSON value:
// {"$bytes": "<hex>"} is []byte, {"$float": "NaN" | "Infinity" |
// "-Infinity"} is float64, {"$int": "<digits>"} is an integer of any size
// (a BigInt in JavaScript, an int in Python). testdata/vectors/inputs.json
// writes the values a line cannot hold with them.
func Revive(v any) any {
	switch x := v.(type) {
	case map[string]any:
		if len(x) == 1 {
			if h, ok := x["$bytes"].(string); ok {
				b, err := hex.DecodeString(h)
				if err != nil {
					panic("vector: bad $bytes tag: " + h)
				}
				return b
			}
			if s, ok := x["$int"].(string); ok {
				return json.Number(s)
			}
			if s, ok := x["$float"].(string); ok {
				switch s {
				case "NaN":
					return math.NaN()
				case "Infinity":
					return math.Inf(1)
				case "-Infinity":
					return math.Inf(-1)
				}
				panic("vector: bad $float tag: " + s)
			}
		}
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = Revive(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = Revive(e)
		}
		return out
	}
	return v
}
