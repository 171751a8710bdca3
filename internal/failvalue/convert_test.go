package failvalue

import (
	"encoding/json"
	"math"
	"os"
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
// its type's words from the schema (contract/abi.json's types[].expects)
// and the host's description: a hint says "a string or a number", as the
// hosts did, not "a string".
func TestConvertOther(t *testing.T) {
	raw, err := os.ReadFile("../../contract/abi.json")
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Types   []struct{ Name, Expects string }
		Failure []struct{ Name, Input, Type string }
	}
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatal(err)
	}
	expects := map[string]string{}
	for _, ty := range schema.Types {
		expects[ty.Name] = ty.Expects
	}
	if len(schema.Failure) != len(Fields) {
		t.Fatalf("%d fields, the schema has %d", len(Fields), len(schema.Failure))
	}
	for _, f := range schema.Failure {
		if f.Input != "" { // the name a value has, when it is not the field's
			f.Name = f.Input
		}
		_, err := Convert(map[string]any{"attempt": Number("1"), f.Name: Other("a timedelta")})
		want := "invalid failure: " + f.Name + ": must be " + expects[f.Type] + " (got a timedelta)"
		if expects[f.Type] == "" || err == nil || err.Error() != want {
			t.Errorf("%s: %v, want %s", f.Name, err, want)
		}
	}
}
