package failvalue

import (
	"math"
	"testing"
)

func TestESFormat(t *testing.T) {
	for f, want := range map[float64]string{
		0: "0", math.Copysign(0, -1): "0", 1: "1", -1.5: "-1.5", 0.1: "0.1", 1e21: "1e+21", 1e20: "100000000000000000000",
		123456789012345680000: "123456789012345680000", 1e-7: "1e-7", 1.5e-7: "1.5e-7", 1e-6: "0.000001",
		5e-324: "5e-324", math.MaxFloat64: "1.7976931348623157e+308", two63: "9223372036854776000",
		math.NaN(): "NaN", math.Inf(1): "Infinity", math.Inf(-1): "-Infinity", 0.30000000000000004: "0.30000000000000004",
	} {
		if got := ESFormat(f); got != want {
			t.Errorf("ESFormat(%v) = %s, want %s", f, got, want)
		}
	}
}

func TestQuote(t *testing.T) {
	if got, want := Quote("a\"\\\b\f\n\r\t\x01\x7f\u2028\u2029é"), `"a\"\\\b\f\n\r\t\u0001`+"\x7f"+`\u2028\u2029é"`; got != want {
		t.Errorf("Quote = %s, want %s", got, want)
	}
}

func TestGRPCCodeByNameFoldsASCIIOnly(t *testing.T) {
	for name, want := range map[string]int{"UNAVAILABLE": 14, "unavailable": 14, "UnAvailable": 14, "OK": 0} {
		if got, ok := GRPCCodeByName(name); !ok || got != want {
			t.Errorf("%s: %d, %v", name, got, ok)
		}
	}
	for _, name := range []string{"UN\u212aNOWN", "unavaılable", "", "UNAVAILABLE "} {
		if _, ok := GRPCCodeByName(name); ok {
			t.Errorf("%q matched", name)
		}
	}
}

// A value of a host's own type (tag other) is refused by every field with
// its type's words and the host's description: a hint says "a string or a
// number", as the hosts did, not "a string".
func TestConvertOther(t *testing.T) {
	want := map[string]string{
		"attempt": "must be an integer", "http_status": "must be a 32-bit integer",
		"grpc_code": "must be a 32-bit integer or a status name", "error_kind": "must be a string",
		"retry_after": "must be a string or a number", "grpc_retry_pushback_ms": "must be a string or a number",
		"method": "must be a string", "idempotency_key": "must be a string or a boolean", "elapsed_ms": "must be an integer",
		"now_ms": "must be an integer", "random": `must be a number, "NaN", "Infinity" or "-Infinity"`,
		"prev_delay_ms": "must be an integer", "retried_downstream": "must be a boolean", "server_declined": "must be a boolean",
	}
	if len(want) != len(Fields) {
		t.Fatalf("%d fields, want %d", len(Fields), len(want))
	}
	for _, field := range Fields {
		_, err := Convert(map[string]any{"attempt": Number("1"), field: Other("a timedelta")})
		if err == nil || err.Error() != "invalid failure: "+field+": "+want[field]+" (got a timedelta)" {
			t.Errorf("%s: %v", field, err)
		}
	}
}
