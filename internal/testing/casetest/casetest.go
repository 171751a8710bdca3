// Package casetest is what the Go replays of the shared cases have in
// common (testdata/queue, testdata/rabbitmq and testdata/idempotency, each
// with its README): reading and regenerating a cases file, "{now±N}" times, the handle
// error with its native kinds, and a policy spy for the error kind decided.
package casetest

import (
	"encoding/json"
	"os"
	"testing"
)

// Read decodes the cases file at path into v, failing t when it cannot.
func Read(t testing.TB, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// Write writes v to path as the generated files are: indented by one
// space, with a final newline.
func Write(t testing.TB, path string, v any) {
	t.Helper()
	out, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, append(out, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
}

// UniqueNames fails t when two cases share a name: the name is how every
// language's replay reports a case.
func UniqueNames[C any](t testing.TB, cases []C, name func(C) string) {
	t.Helper()
	seen := map[string]bool{}
	for _, c := range cases {
		n := name(c)
		if seen[n] {
			t.Fatalf("case %q: name given twice", n)
		}
		seen[n] = true
	}
}
