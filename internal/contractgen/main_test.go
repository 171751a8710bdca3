package main

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/backstop-dev/backstop/policy"
)

// The committed files are what the schema generates (CI runs -check too).
func TestGeneratedFilesAreCurrent(t *testing.T) {
	if err := run("../..", true); err != nil {
		t.Fatal(err)
	}
}

// A schema whose parts do not fit together fails make contract, naming the
// part, rather than a host at run time.
func TestSchemaMistakes(t *testing.T) {
	for _, tc := range []struct{ name, schema, want string }{
		{"unknown key", `{"version": 1, "typo": 1}`, `unknown field "typo"`},
		{"flag bit taken", `{"flags": [{"name": "a", "bit": 0}, {"name": "b", "bit": 0}]}`, "flags: b: bit 0"},
		{"bool without a flag", `{"types": [{"name": "bool", "expects": "a boolean"}], "failure": [{"name": "x", "type": "bool"}]}`, "a bool field needs a flag bit"},
		{"type without its text", `{"types": [{"name": "bool"}]}`, "types: bool: expects must be plain text"},
		{"code without names", `{"types": [{"name": "grpc_code", "expects": "a code"}]}`, "has the status names"},
		{"method of no argument", `{"exports": [{"name": "m", "params": [{"name": "h", "type": "i32"}], "result": "i32", "method": {"answer": "ms"}}]}`, "a method takes (h i32, x i64)"},
		{"method of two arguments, not now_ms first", `{"exports": [{"name": "m", "params": [{"name": "h", "type": "i32"}, {"name": "a", "type": "i64"}, {"name": "b", "type": "i64"}], "result": "i32", "method": {"answer": "ms"}}]}`, "or (h i32, now_ms i64, x i64)"},
		{"method of now_ms twice", `{"exports": [{"name": "m", "params": [{"name": "h", "type": "i32"}, {"name": "now_ms", "type": "i64"}, {"name": "now_ms", "type": "i64"}], "result": "i32", "method": {"answer": "ms"}}]}`, "or (h i32, now_ms i64, x i64)"},
		{"method that stops, with no stateless answer", `{"exports": [{"name": "m", "params": [{"name": "h", "type": "i32"}, {"name": "x", "type": "i64"}], "result": "i32", "method": {"answer": "none", "stops": 1}}]}`, "needs the stateless answer"},
		{"fact of no export", `{"facts": [{"export": "gone", "name": "x", "answer": "bool"}]}`, `facts: x: export "gone" is not one of the policy's handle alone`},
		{"fact of two arguments", `{"exports": [{"name": "m", "params": [{"name": "h", "type": "i32"}, {"name": "x", "type": "i64"}], "result": "i32"}], "facts": [{"export": "m", "name": "x", "answer": "bool"}]}`, "not one of the policy's handle alone"},
		{"fact of no answer", `{"exports": [{"name": "m", "params": [{"name": "h", "type": "i32"}], "result": "i32"}], "facts": [{"export": "m", "name": "x", "answer": "word"}]}`, `facts: x: unknown answer "word"`},
		{"unknown type", `{"failure": [{"name": "x", "type": "uint7"}]}`, `unknown type "uint7"`},
		{"record gap", `{"record": {"size": 16, "fields": [{"name": "a", "type": "i64", "offset": 0}]}}`, "fields end at 8, not at size 16"},
		{"word overlap", `{"enums": [], "words": [{"name": "w", "fields": [{"name": "a", "lo": 0, "bits": 8}, {"name": "b", "lo": 4, "bits": 8}]}]}`, "w.b: bits 4-11 overlap"},
		{"enum too wide", `{"enums": [{"name": "e", "values": [{"code": 9, "name": "x"}]}], "words": [{"name": "w", "fields": [{"name": "a", "lo": 0, "bits": 3, "enum": "e"}]}]}`, "3 bits cannot hold e 9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse([]byte(tc.schema))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("parse = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// The schema's presets are the core's (the hosts' CLIs and tests list them
// from the schema; policy/presets.go defines them).
func TestSchemaPresetsAreTheCores(t *testing.T) {
	s := schemaFile(t)
	var names []string
	for _, p := range s.Presets {
		names = append(names, p.Name)
	}
	if want := policy.PresetNames(); !slices.Equal(names, want) {
		t.Errorf("contract/abi.json presets = %v, want policy.PresetNames() %v", names, want)
	}
}

// record_duration is a method of (h, now_ms, duration_ms): in NowMethods,
// not Methods (the templates render those with both arguments), and it
// stops calling once the module answers 1.
func TestRecordDurationIsANowMethod(t *testing.T) {
	s := schemaFile(t)
	var now []string
	for _, e := range s.NowMethods() {
		now = append(now, e.Name)
	}
	for _, e := range s.Methods() {
		if e.TakesNow() || e.Name == "record_duration" {
			t.Errorf("Methods has %s", e.Name)
		}
	}
	if !slices.Equal(now, []string{"record_duration"}) {
		t.Fatalf("NowMethods = %v", now)
	}
	e := s.NowMethods()[0]
	if e.Arg() != "duration_ms" || e.Method.Stops == nil || *e.Method.Stops != 1 || e.Method.Stateless == nil {
		t.Errorf("record_duration: arg %s, method %+v", e.Arg(), e.Method)
	}
	if doc := docIn(e, e.Method.Doc, func(n string) string { return n }, strings.ToUpper); !strings.Contains(doc, "NOW_MS is when") ||
		!strings.Contains(doc, "(DURATION_MS,") {
		t.Errorf("doc: %s", doc)
	}
}

// schemaFile is contract/abi.json, parsed.
func schemaFile(t *testing.T) *Schema {
	t.Helper()
	data, err := os.ReadFile("../../contract/abi.json")
	if err != nil {
		t.Fatal(err)
	}
	s, err := parse(data)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
