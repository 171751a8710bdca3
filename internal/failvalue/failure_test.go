package failvalue

import (
	"math"
	"reflect"
	"strconv"
	"testing"

	"github.com/backstop-dev/backstop/policy"
)

var itoa = strconv.Itoa

// A valid failure is read without allocating (its strings alias the
// encoding): in the module every allocation is paid for by the export.
func TestDecodeFailureDoesNotAllocate(t *testing.T) {
	b, err := Append(nil, map[string]any{
		"attempt": 3, "http_status": 503, "grpc_code": "unavailable", "error_kind": []byte("timeout"),
		"retry_after": "7", "grpc_retry_pushback_ms": Number("250"), "method": "POST", "idempotency_key": true,
		"elapsed_ms": 12.5, "now_ms": int64(1_700_000_000_000), "random": 0.5, "prev_delay_ms": nil,
		"retried_downstream": false, "server_declined": true})
	if err != nil {
		t.Fatal(err)
	}
	var f policy.Failure
	malformed, err := DecodeFailure(b, &f)
	if err != nil || malformed || f.GRPCCode != 14 || f.RetryPushback != "250" || f.Method != "POST" || f.ElapsedMs != 12 {
		t.Fatalf("DecodeFailure = %+v, %v, %v", f, malformed, err)
	}
	if n := testing.AllocsPerRun(100, func() { DecodeFailure(b, new(policy.Failure)) }); n != 0 {
		t.Errorf("DecodeFailure allocates %v times", n)
	}
}

// Duplicate keys are found past keySet's array too, in the failure and in
// a nested object.
func TestDecodeFailureManyKeys(t *testing.T) {
	var b []byte
	for _, dup := range []string{"", "k03"} {
		for _, nested := range []bool{false, true} {
			keys := 20
			if dup != "" {
				keys++
			}
			obj := appendLen([]byte{8}, keys)
			for i := range 20 {
				obj = append(appendText(obj, "k"+string(rune('0'+i/10))+string(rune('0'+i%10))), 0)
			}
			if dup != "" {
				obj = append(appendText(obj, dup), 0)
			}
			b = obj
			if nested {
				b = append(appendText(appendLen([]byte{8}, 1), "attempt"), obj...)
			}
			checkDecodeFailure(t, b)
			malformed, err := DecodeFailure(b, new(policy.Failure))
			want := "invalid failure: k00: unknown field"
			switch {
			case dup != "":
				want = "invalid failure: value: duplicate key \"k03\" at byte " + itoa(len(b)-len(dup)-5)
			case nested:
				want = "invalid failure: attempt: must be an integer (got an object)"
			}
			if err == nil || err.Error() != want || malformed != (dup != "") {
				t.Errorf("dup %q, nested %v: %v (malformed %v), want %s", dup, nested, err, malformed, want)
			}
		}
	}
}

// checkDecodeFailure checks that DecodeFailure(b) is what Convert makes of
// Decode(b): the same failure, or the same error, malformed or not.
func checkDecodeFailure(t *testing.T, b []byte) {
	t.Helper()
	var f policy.Failure
	malformed, err := DecodeFailure(b, &f)
	v, decErr := Decode(b)
	if decErr != nil {
		if !malformed || err == nil || err.Error() != decErr.Error() {
			t.Fatalf("%x: DecodeFailure = %v (malformed %v), Decode = %v", b, err, malformed, decErr)
		}
		return
	}
	want, wantErr := Convert(v)
	if malformed || (err == nil) != (wantErr == nil) || (err != nil && err.Error() != wantErr.Error()) {
		t.Fatalf("%x: DecodeFailure = %v (malformed %v), Convert = %v", b, err, malformed, wantErr)
	}
	// Compare random by its bits: NaN is not equal to itself.
	if math.Float64bits(f.Random) != math.Float64bits(want.Random) {
		t.Fatalf("%x: random %v, Convert %v", b, f.Random, want.Random)
	}
	f.Random, want.Random = 0, 0
	if !reflect.DeepEqual(f, want) {
		t.Fatalf("%x: DecodeFailure = %+v, Convert = %+v", b, f, want)
	}
}

func BenchmarkDecodeFailure(b *testing.B) {
	enc, _ := Append(nil, map[string]any{"attempt": 3, "http_status": 503, "now_ms": int64(1_700_000_000_000), "random": 0.5})
	b.Run("DecodeFailure", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var f policy.Failure
			DecodeFailure(enc, &f)
		}
	})
	b.Run("Decode+Convert", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			v, _ := Decode(enc)
			Convert(v)
		}
	})
}
