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
		{"backoff:\n  base: 1s\n  cap: |\n    2s\n---\nbackoff: {cap: 9s}\n", 5},
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
		"name: |\n  ---\n  ...\n", // indented: text of the block
		"name: \"a --- b\"\n",
	} {
		if _, err := policy.Parse([]byte(src)); err != nil {
			t.Errorf("Parse(%q): %v", src, err)
		}
	}
	// "---x" is a key, not a marker.
	wantProblem(t, mustFail(t, "name: a\n---x: 1\n"), "---x", "unknown field")
}

// Aliases resolve to what their anchors mark: the same policy as the one
// written out.
func TestParseResolvesAliases(t *testing.T) {
	aliased := `
name: &n checkout
max_attempts: &three 3
uncertain: {max_attempts: *three}
backoff: &b {strategy: linear, base: &base 2s, cap: 9s}
jitter: {mode: none}
retry_after: {cap: *base, honor: &yes true}
classify:
  http: &codes {"404": &r retryable, "5xx": permanent}
  error_kinds: {*n : *r}
idempotency:
  idempotent_methods: [GET, &post POST]
  never_sent_kinds: [*n]
circuit_breaker: {failure_threshold: *three, open_for: *base}
`
	plain := `
name: checkout
max_attempts: 3
uncertain: {max_attempts: 3}
backoff: {strategy: linear, base: 2s, cap: 9s}
jitter: {mode: none}
retry_after: {cap: 2s, honor: true}
classify:
  http: {"404": retryable, "5xx": permanent}
  error_kinds: {checkout: retryable}
idempotency:
  idempotent_methods: [GET, POST]
  never_sent_kinds: [checkout]
circuit_breaker: {failure_threshold: 3, open_for: 2s}
`
	a, p := mustParse(t, aliased), mustParse(t, plain)
	if a.String() != p.String() {
		t.Errorf("aliased:\n%s\nwritten out:\n%s", a, p)
	}
	for _, f := range []policy.Failure{
		{Attempt: 2, HTTPStatus: 404, NowMs: 1},
		{Attempt: 1, HTTPStatus: 503, NowMs: 1},
		{Attempt: 1, ErrorKind: "checkout", Method: "POST", NowMs: 1},
		{Attempt: 1, ErrorKind: "checkout", Method: "PATCH", NowMs: 1},
		{Attempt: 1, HTTPStatus: 503, RetryAfter: "5", NowMs: 1},
	} {
		if da, dp := mustDecide(t, a, f), mustDecide(t, p, f); da != dp {
			t.Errorf("%+v: aliased %+v, written out %+v", f, da, dp)
		}
	}
	// extends too, and its problem keeps its line.
	if p := mustParse(t, "name: &p critical\nextends: *p\n"); p.MaxAttempts() != 3 {
		t.Errorf("extends an alias to critical: %s", p)
	}
	var pe *policy.Error
	if _, err := policy.Parse([]byte("name: &p nightly\nextends: *p\n")); !errors.As(err, &pe) || pe.Problems[0].Line != 2 {
		t.Errorf("extends an unknown preset: %v", err)
	}
	// An alias to a value of the wrong type is reported as that value.
	wantProblem(t, mustFail(t, "x: &n three\n"), "x", "unknown field")
	wantProblem(t, mustFail(t, "name: &n 3\nmax_attempts: *n\n"), "name", `must be a string (got 3)`)
	wantProblem(t, mustFail(t, "backoff: &b {base: 1s}\nmax_attempts: *b\n"), "max_attempts", "must be an integer")
}

// Merge keys merge as YAML defines them: the mapping's own keys win over
// merged ones, and an earlier merged mapping over a later one.
func TestParseMergesMergeKeys(t *testing.T) {
	p := mustParse(t, `
backoff: &fast {strategy: constant, base: 50ms, cap: 50ms}
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

// Merges of merges of the same anchors expand each mapping once: a file
// that doubles its merged mappings a thousand times costs what its size
// says, where expanding each merge would never end.
func TestParseMergeBombIsLinear(t *testing.T) {
	var b strings.Builder
	b.WriteString("anchors:\n  - &m0 {base: 2s, cap: 8s}\n")
	n := 1
	for ; b.Len() < 32<<10; n++ {
		fmt.Fprintf(&b, "  - &m%d {<<: [*m%d, *m%d]}\n", n, n-1, n-1)
	}
	fmt.Fprintf(&b, "backoff: {<<: *m%d}\n", n-1)
	allocs := testing.AllocsPerRun(1, func() {
		_, err := policy.Parse([]byte(b.String()))
		if err == nil || err.Error() != "invalid policy: anchors: unknown field" {
			t.Fatalf("%d nested merges: %v", n, err)
		}
	})
	if allocs > 200_000 {
		t.Errorf("%d nested merges: %.0f allocations", n, allocs)
	}
}

// An explicit tag is taken at its word, and a value of the wrong type says
// which tag it has; YAML integers in other bases are refused by name.
func TestParseSaysWhichTagAValueHas(t *testing.T) {
	for _, c := range []struct{ src, field, reason string }{
		{"max_attempts: !!str 3\n", "max_attempts", `must be an integer (got !!str "3")`},
		{"max_attempts: !!binary AAA=\n", "max_attempts", `must be an integer (got !!binary "AAA=")`},
		{"max_attempts: !local 3\n", "max_attempts", `must be an integer (got !local "3")`},
		{"max_attempts: !!float 3\n", "max_attempts", `must be an integer (got !!float "3")`},
		{"max_attempts: 0x10\n", "max_attempts", `must be a decimal integer (got "0x10")`},
		{"max_attempts: 1_000\n", "max_attempts", `must be a decimal integer (got "1_000")`},
		{"name: !!binary aGk=\n", "name", "must be a string (got !!binary aGk=)"},
		{"backoff: {base: !!int 1000}\n", "backoff.base", "(got !!int 1000)"},
		{"backoff: {multiplier: !!str 2}\n", "backoff.multiplier", `at most 3 decimal places (got !!str "2")`},
		{"retry_after: {honor: !!str true}\n", "retry_after.honor", `must be true or false (got !!str "true")`},
		{"jitter: {mode: !!binary bm9uZQ==}\n", "jitter.mode", `(got !!binary "bm9uZQ==")`},
		{"backoff: !!set {base, cap}\n", "backoff", "must be an object (got a mapping tagged !!set)"},
		{"idempotency: {idempotent_methods: !!set {GET}}\n", "idempotency.idempotent_methods", "must be a list of strings"},
		{"? [max_attempts]\n: 3\n", "(document)", "keys must be strings"},
	} {
		wantProblem(t, mustFail(t, c.src), c.field, c.reason)
	}
	// Tags that agree with the field are fine, and so is "<<" as a value.
	p := mustParse(t, "name: <<\nmax_attempts: !!int 3\nbackoff: !!map {base: !!str 2s, cap: 4s}\n")
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
