package main

import (
	"strings"
	"testing"
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
