package vector

import (
	"encoding/hex"
	"encoding/json"
	"math"

	"github.com/backstop-dev/backstop/internal/failvalue"
)

// FromValue converts a failure given as a JSON value to an Input, with the
// rules every host applies to the values its callers pass to decide
// (testdata/vectors/README.md, "Field values"): failvalue.Convert, the
// module's own (decide_value). v comes from a decoder with UseNumber: nil,
// bool, json.Number, string, []any, map[string]any; also float64 (NaN,
// ±Inf) and []byte (bytes), which hosts' languages have and JSON does not
// (see Revive).
//
// A field problem is a *policy.InputError naming the field. Unknown fields
// come first (the least name in code point order), then the fields in the
// order of failvalue.Fields. The module checks ranges afterwards.
func FromValue(v any) (Input, error) {
	f, err := failvalue.Convert(Native(v))
	if err != nil {
		return Input{}, err
	}
	return FromFailure(f), nil
}

// Native is a decoded JSON value in failvalue's types: each json.Number
// becomes a failvalue.Number (failvalue does not import encoding/json).
func Native(v any) any {
	switch x := v.(type) {
	case json.Number:
		return failvalue.Number(x)
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = Native(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = Native(e)
		}
		return out
	}
	return v
}

// EncodeValue is the failure value encoding (failvalue.Append, what
// decide_value reads) of a decoded JSON value, as FromValue takes it.
func EncodeValue(v any) ([]byte, error) {
	return failvalue.Append(nil, Native(v))
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
