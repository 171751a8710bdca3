package failvalue

import (
	"bytes"
	"errors"
	"math"
	"math/big"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/backstop-dev/backstop/internal/abi"
	"github.com/backstop-dev/backstop/policy"
)

// hintNumber writes a float as the integer it rounds up to with strconv;
// it was math/big's exact conversion, which backstop.wasm does not link.
func TestHintNumberIsExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	fs := []float64{0, math.Copysign(0, -1), -0.5, 0.5, 1.5, -1.5, 1e21, 1e300, -1e300, math.MaxFloat64, -math.MaxFloat64,
		5e-324, two63, -two63, 123456789.123, 4.5e15, 9007199254740993}
	for range 5000 {
		fs = append(fs, math.Float64frombits(rng.Uint64()))
	}
	for _, f := range fs {
		if math.IsNaN(f) || math.IsInf(f, 0) {
			continue
		}
		i, _ := new(big.Float).SetFloat64(math.Ceil(f)).Int(nil)
		if got := hintNumber(f); got != i.String() {
			t.Fatalf("hintNumber(%v) = %s, want %s", f, got, i)
		}
	}
}

func TestDecodeRoundTrip(t *testing.T) {
	v := map[string]any{
		"attempt": Number("123456789012345678901234567890"), "http_status": Number("-0"), "random": math.Inf(-1),
		"method": "PÖST", "error_kind": []byte{0, 0xff}, "idempotency_key": true, "retry_after": nil,
		"x": []any{}, "y": map[string]any{"z": map[string]any{}}, "w": Other("a timedelta"), "": false,
	}
	b, err := Append(nil, v)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(b)
	if err != nil || !reflect.DeepEqual(got, v) {
		t.Fatalf("Decode(Append(v)) = %#v, %v", got, err)
	}
	again, _ := Append(nil, got)
	if !bytes.Equal(again, b) {
		t.Fatal("Append is not reproducible")
	}
	// A decimal Number is the float64 it reads as; int and int64 are integers.
	for _, c := range []struct{ in, want any }{
		{Number("1e3"), 1000.0}, {Number("2.5"), 2.5}, {int(-7), Number("-7")}, {int64(math.MinInt64), Number("-9223372036854775808")},
	} {
		b, _ := Append(nil, c.in)
		if got, err := Decode(b); err != nil || got != c.want {
			t.Errorf("%#v: %#v, %v", c.in, got, err)
		}
	}
	if _, err := Append(nil, struct{}{}); err == nil {
		t.Error("Append took a struct")
	}
}

func TestDecodeMalformed(t *testing.T) {
	deep := []byte{}
	for range MaxDepth + 1 {
		deep = append(deep, abi.ValueObject, 1, 0, 0, 0, 1, 0, 0, 0, 'k')
	}
	deep = append(deep, abi.ValueNull)
	for _, c := range []struct {
		b      []byte
		reason string
	}{
		{nil, "a value runs past the end at byte 0"},
		{[]byte{10}, "unknown tag 10 at byte 0"},
		{[]byte{abi.ValueFloat, 1, 2, 3}, "a float runs past the end at byte 1"},
		{[]byte{abi.ValueString, 0xff, 0xff, 0xff, 0xff}, "a string length 4294967295 runs past the end at byte 1"},
		{[]byte{abi.ValueObject, 0xff, 0xff, 0xff, 0x0f, 0}, "an object length 268435455 runs past the end at byte 1"},
		{[]byte{abi.ValueInt, 0, 0, 0, 0}, "an integer is not a decimal integer at byte 5"},
		{[]byte{abi.ValueInt, 1, 0, 0, 0, '-'}, "an integer is not a decimal integer at byte 6"},
		{[]byte{abi.ValueInt, 2, 0, 0, 0, '+', '1'}, "an integer is not a decimal integer at byte 7"},
		{[]byte{abi.ValueObject, 2, 0, 0, 0, 1, 0, 0, 0, 'a', 0, 1, 0, 0, 0, 'a', 1}, `duplicate key "a" at byte 11`},
		{[]byte{abi.ValueObject, 1, 0, 0, 0, 1, 0, 0, 0, 0xc3, 0}, "a key is not UTF-8 at byte 9"},
		{[]byte{abi.ValueNull, abi.ValueNull}, "1 bytes after the value at byte 1"},
		{deep, "objects nested deeper than 32 levels at byte 320"},
	} {
		checkDecodeFailure(t, c.b)
		v, err := Decode(c.b)
		var ie *policy.InputError
		if !errors.As(err, &ie) || ie.Field != "value" || ie.Reason != c.reason || v != nil {
			t.Errorf("%x: %v, %v; want value: %s", c.b, v, err, c.reason)
		}
	}
	if _, err := Decode(deep[10:]); err != nil {
		t.Errorf("32 levels: %v", err)
	}
	checkDecodeFailure(t, deep)
	checkDecodeFailure(t, deep[10:])
}

// Decode never panics, and what it decodes encodes back to the same bytes
// (keys sorted) and converts as the value it is; DecodeFailure reads every
// input as Convert(Decode(b)) does.
func FuzzDecode(f *testing.F) {
	for _, v := range []any{
		map[string]any{"attempt": Number("2"), "http_status": 503.0, "method": "GET", "grpc_code": "unavailable"},
		map[string]any{"retry_after": []byte("7"), "x": map[string]any{"y": []any{}}, "random": Other("a Decimal")},
		nil, true, Number("-12345678901234567890"),
	} {
		b, _ := Append(nil, v)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		checkDecodeFailure(t, b)
		v, err := Decode(b)
		if err != nil {
			return
		}
		Convert(v)
		again, err := Append(nil, v)
		if err != nil {
			t.Fatalf("Append(Decode(%x)): %v", b, err)
		}
		if v2, err := Decode(again); err != nil || !reflect.DeepEqual(sansNaN(v2), sansNaN(v)) {
			t.Fatalf("%x: decoded %#v, then %#v (%v)", b, v, v2, err)
		}
	})
}

// sansNaN replaces NaN (never equal to itself) for comparison.
func sansNaN(v any) any {
	switch x := v.(type) {
	case float64:
		if math.IsNaN(x) {
			return "NaN"
		}
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			out[k] = sansNaN(e)
		}
		return out
	}
	return v
}
