package vector

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

func TestScanLine(t *testing.T) {
	for _, c := range []struct {
		line    string
		depth   int
		longNum bool
	}{
		{`{"a":[[1]]}`, 3, false},
		{`{"a":"[[[[\"]]]"}`, 1, false},
		{`{"a":"[[[`, 1, false}, // an unterminated string runs to the end
		{`{"a":"x\`, 1, false},  // so does one ending in '\'
		{`]]]{`, 0, false},      // closers first lower the level
		{`{"a":` + "1234567890123456789012345678901234" + `}`, 1, true},
		{`{"a":"1234567890123456789012345678901234"}`, 1, false},
	} {
		if d, l := scanLine([]byte(c.line)); d != c.depth || l != c.longNum {
			t.Errorf("%s: depth %d, long %v; want %d, %v", c.line, d, l, c.depth, c.longNum)
		}
	}
}
