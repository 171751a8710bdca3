package policy_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/backstop-dev/backstop/policy"
)

// A second YAML document is an error naming its line, never ignored.
func TestParseRefusesASecondDocument(t *testing.T) {
	for _, c := range []struct {
		src  string
		line int
	}{
		{"max_attempts: 3\n---\nmax_attempts: 4\n", 2},
		{"---\nmax_attempts: 3\n--- # the next one\nmax_attempts: 4\n", 3},
		{"max_attempts: 3\n...\nmax_attempts: 4\n", 3},               // content after the end marker
		{"max_attempts: 3\n---\n", 2},                                // an empty one says nothing, but is still one
		{"{\"max_attempts\": 3}\r\n---\r\n{\"max_attempts\": 4}", 2}, // CRLF
		{"max_attempts: 3\n---\n{", 2},                               // whatever follows
		{"backoff:\n  base: 1s\n  cap: \"2s\" # ---\n---\nbackoff: {cap: 9s}\n", 4},
	} {
		_, err := policy.Parse([]byte(c.src))
		var pe *policy.Error
		if !errors.As(err, &pe) || len(pe.Problems) != 1 {
			t.Errorf("Parse(%q) = %v, want one problem", c.src, err)
			continue
		}
		want := fmt.Sprintf("must be one YAML document (a second one starts at line %d)", c.line)
		if p := pe.Problems[0]; p.Field != "(document)" || p.Reason != want || p.Line != c.line {
			t.Errorf("Parse(%q): %+v, want line %d: %s", c.src, p, c.line, want)
		}
	}
	// Markers that open or close the one document, and look-alikes.
	for _, src := range []string{
		"---\nmax_attempts: 3\n",
		"--- {max_attempts: 3}\n",
		"\ufeff---\nmax_attempts: 3\n...\n# the end\n",
		"max_attempts: 3\n...\n",
		"name: \"a --- b\"\n",
	} {
		if _, err := policy.Parse([]byte(src)); err != nil {
			t.Errorf("Parse(%q): %v", src, err)
		}
	}
	// "---x" is a key, not a marker.
	wantProblem(t, mustFail(t, "name: a\n---x: 1\n"), "---x", "unknown field")
}

// YAML outside the subset policy files are read in (natively as in
// backstop.wasm: one reader) is one problem naming the field, the line, the
// feature and how to write the policy without it.
func TestParseRefusesYAMLOutsideTheSubset(t *testing.T) {
	const (
		anchor   = `anchors and aliases are not supported (found the anchor %q): write the value out in each place it is used`
		alias    = `anchors and aliases are not supported (found the alias %q): write out the value it stands for`
		tag      = `tags are not supported (found the tag %q): remove the tag; quote the value to make it a string`
		block    = `block scalars (| and >) are not supported: write the value on the key's line, quoted if need be`
		multLine = `unexpected content at indentation 2 (a key at indentation 0 ended above: check the indentation; a value over several lines is not supported: write it on one line)`
	)
	for _, c := range []struct {
		src, field string
		line       int
		reason     string
	}{
		{"name: &n checkout\n", "name", 1, fmt.Sprintf(anchor, "&n")},
		{"max_attempts: 3\nbackoff: &b {base: 1s}\n", "backoff", 2, fmt.Sprintf(anchor, "&b")},
		{"backoff: &b\n  base: 1s\n", "backoff", 1, fmt.Sprintf(anchor, "&b")},
		{"idempotency:\n  idempotent_methods: [GET, &post POST]\n", "idempotency.idempotent_methods[1]", 2, fmt.Sprintf(anchor, "&post")},
		{"idempotency:\n  idempotent_methods:\n    - GET\n    - &m {a: 1}\n", "idempotency.idempotent_methods[1]", 4, fmt.Sprintf(anchor, "&m")},
		{"--- &doc {max_attempts: 3}\n", "(document)", 1, fmt.Sprintf(anchor, "&doc")},
		{"max_attempts: 3\nuncertain: {max_attempts: *three}\n", "uncertain.max_attempts", 2, fmt.Sprintf(alias, "*three")},
		{"classify:\n  error_kinds: {*n : retryable}\n", "classify.error_kinds", 2, fmt.Sprintf(alias, "*n")},
		{"extends: *p\n", "extends", 1, fmt.Sprintf(alias, "*p")},
		// Merge keys of aliases: the alias is what is refused.
		{"backoff:\n  <<: *defaults\n  cap: 9s\n", "backoff.<<", 2, fmt.Sprintf(alias, "*defaults")},
		{"circuit_breaker: {<<: [*a, *b]}\n", "circuit_breaker.<<[0]", 1, fmt.Sprintf(alias, "*a")},
		{"max_attempts: !!str 3\n", "max_attempts", 1, fmt.Sprintf(tag, "!!str")},
		{"max_attempts: !local 3\n", "max_attempts", 1, fmt.Sprintf(tag, "!local")},
		{"backoff: !!set {base, cap}\n", "backoff", 1, fmt.Sprintf(tag, "!!set")},
		{"backoff: {base: !!int 1000}\n", "backoff.base", 1, fmt.Sprintf(tag, "!!int")},
		{"name: |\n  ---\n  ...\n", "name", 1, block},
		{"backoff:\n  base: 1s\n  cap: >-\n    2s\n", "backoff.cap", 3, block},
		{"? [max_attempts]\n: 3\n", "(document)", 1, `complex keys (?) are not supported: write the key as key: value`},
		{"%YAML 1.2\n---\nmax_attempts: 3\n", "(document)", 1, `directives (%YAML, %TAG) are not supported: remove the line`},
		{"backoff:\n\tbase: 1s\n", "backoff", 2, `tabs at the start of a line are not supported: indent with spaces`},
		{"name: 2026-01-01\n", "name", 1, `a value that reads as a date or timestamp ("2026-01-01") is not supported: quote it to make it a string`},
		{"name: a\n  b\n", "name", 2, multLine},
		{"name: \"a\n  b\"\n", "name", 1, `a quoted value over several lines is not supported: close the quote on the line it opens on`},
		{"name:\n  checkout\n", "name", 2, `a value on the line below its key is not supported: write it on the key's line (key: value)`},
		{"idempotency:\n  idempotent_methods:\n    -\n      GET\n", "idempotency.idempotent_methods[0]", 3, `a list item on the line below its '-' is not supported: write it on the '-' line`},
		{"idempotency:\n  idempotent_methods:\n    - - GET\n", "idempotency.idempotent_methods[0]", 3, `a list inside a block list item is not supported: write the items one per '-' line, or the list as [a, b]`},
		{"idempotency:\n  idempotent_methods:\n    - a: 1\n", "idempotency.idempotent_methods[0]", 3, `an object inside a block list item is not supported: write it as - {key: value}`},
		{"idempotency: {idempotent_methods: [GET, PUT,]}\n", "idempotency.idempotent_methods", 1, `a trailing comma is not supported: remove the last ','`},
		{"classify: {[a]: 1}\n", "classify", 1, `an object or a list as a key is not supported: keys must be strings`},
		{"idempotency: {idempotent_methods: [GET: 1]}\n", "idempotency.idempotent_methods[0]", 1, `a key: value pair in a [...] list is not supported: write it as {key: value}`},
	} {
		_, err := policy.Parse([]byte(c.src))
		var pe *policy.Error
		if !errors.As(err, &pe) || len(pe.Problems) != 1 {
			t.Errorf("Parse(%q) = %v, want one problem", c.src, err)
			continue
		}
		want := fmt.Sprintf("line %d: %s", c.line, c.reason)
		if p := pe.Problems[0]; p.Field != c.field || p.Line != c.line || p.Reason != want {
			t.Errorf("Parse(%q):\n got %s (line %d): %s\nwant %s (line %d): %s", c.src, p.Field, p.Line, p.Reason, c.field, c.line, want)
		}
	}
}

// Merge keys merge as YAML defines them: the mapping's own keys win over
// merged ones, and an earlier merged mapping over a later one.
func TestParseMergesMergeKeys(t *testing.T) {
	p := mustParse(t, `
backoff: {strategy: constant, base: 50ms, cap: 50ms}
jitter: {mode: none}
circuit_breaker:
  <<: [{open_for: 5s, failure_threshold: 7}, {open_for: 9s, half_open_successes: 2}]
  failure_threshold: 3
retry_after:
  <<: {cap: 10s, on_exceed: clamp}
classify:
  grpc:
    <<: {UNAVAILABLE: permanent, DEADLINE_EXCEEDED: permanent}
    "14": uncertain
`)
	want := "circuit breaker opens after 3 failures for 5s"
	if !strings.Contains(p.String(), want) || !strings.Contains(p.String(), "cap 10s (clamp beyond)") {
		t.Errorf("%s\nwant %q and the merged retry_after", p, want)
	}
	// "14" is UNAVAILABLE: the key written wins over the merged name.
	for code, class := range map[int]policy.Class{14: policy.Uncertain, 4: policy.Permanent} {
		if d := mustDecide(t, p, policy.Failure{Attempt: 1, GRPCCode: code, NowMs: 1}); d.Class != class {
			t.Errorf("gRPC %d: %s, want %s", code, d.Class, class)
		}
	}
	// A merge of a merge.
	q := mustParse(t, "jitter: {<<: {<<: {mode: proportional}, ratio: 0.5}, ratio: 0.25}\n")
	if !strings.Contains(q.String(), "proportional jitter ±0.25") {
		t.Errorf("nested merge: %s", q)
	}

	for _, c := range []struct{ src, field, reason string }{
		{"backoff:\n  <<: 3\n", "backoff.<<", "must be an object or a list of objects to merge"},
		{"backoff:\n  <<: [{base: 1s}, [1]]\n", "backoff.<<", "must be an object or a list of objects to merge"},
		{"backoff:\n  <<: {base: 1s, base: 2s}\n", "backoff.base", "duplicate key"},
		{"backoff:\n  <<: {bsae: 1s}\n", "backoff.bsae", "unknown field"},
		{"backoff:\n  base: 1s\n  base: 2s\n  <<: {cap: 9s}\n", "backoff.base", "duplicate key"},
		// Quoted, "<<" is a key like any other.
		{"backoff:\n  \"<<\": {base: 1s}\n", "backoff.<<", "unknown field"},
	} {
		wantProblem(t, mustFail(t, c.src), c.field, c.reason)
	}
}

// A merge bomb (merges of merges of the same anchors, doubling a thousand
// times) is refused at its first anchor, before any merge, at the cost of
// reading the file.
func TestParseMergeBombIsRefused(t *testing.T) {
	var b strings.Builder
	b.WriteString("anchors:\n  - &m0 {base: 2s, cap: 8s}\n")
	n := 1
	for ; b.Len() < 32<<10; n++ {
		fmt.Fprintf(&b, "  - &m%d {<<: [*m%d, *m%d]}\n", n, n-1, n-1)
	}
	fmt.Fprintf(&b, "backoff: {<<: *m%d}\n", n-1)
	allocs := testing.AllocsPerRun(1, func() {
		_, err := policy.Parse([]byte(b.String()))
		want := `invalid policy: anchors[0]: line 2: anchors and aliases are not supported (found the anchor "&m0")`
		if err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Fatalf("%d nested merges: %v", n, err)
		}
	})
	if allocs > 200_000 {
		t.Errorf("%d nested merges: %.0f allocations", n, allocs)
	}
}

// Integers are decimal: YAML integers in other bases are refused by name;
// "<<" is a value like any other.
func TestParseIntegersAreDecimal(t *testing.T) {
	for _, c := range []struct{ src, field, reason string }{
		{"max_attempts: 0x10\n", "max_attempts", `must be a decimal integer (got "0x10")`},
		{"max_attempts: 1_000\n", "max_attempts", `must be a decimal integer (got "1_000")`},
		{"max_attempts: 3.0\n", "max_attempts", `must be an integer (got "3.0")`},
		{"max_attempts: \"3\"\n", "max_attempts", `must be an integer (got "3")`},
	} {
		wantProblem(t, mustFail(t, c.src), c.field, c.reason)
	}
	p := mustParse(t, "name: <<\nmax_attempts: 3\nbackoff: {base: \"2s\", cap: 4s}\n")
	if p.Name() != "<<" || p.MaxAttempts() != 3 {
		t.Errorf("%s", p)
	}
}

func mustFail(t *testing.T, src string) error {
	t.Helper()
	_, err := policy.Parse([]byte(src))
	if err == nil {
		t.Fatalf("Parse(%q): no error", src)
	}
	return err
}
