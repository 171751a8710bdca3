package policy_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/backstop-dev/backstop/policy"
)

// The limits are literals here, as docs/policy.md states them: changing
// one changes the contract, and this test with it.

// A file over 64 KiB is refused before it is parsed: the one problem is its
// size, however broken or huge the rest, and nothing is built from it.
func TestParseRefusesAFileOverTheSizeLimitBeforeParsing(t *testing.T) {
	huge := []byte("x: [" + strings.Repeat("0,", 1<<20) + "0]") // 2 MiB: seconds to parse, had it been
	for _, src := range [][]byte{huge, []byte("{" + strings.Repeat(" ", 64<<10))} {
		_, err := policy.Parse(src)
		var pe *policy.Error
		if !errors.As(err, &pe) || len(pe.Problems) != 1 {
			t.Fatalf("Parse(%d bytes) = %v, want one problem", len(src), err)
		}
		if p := pe.Problems[0]; p.Field != "(document)" || p.Reason != "must be at most 65536 bytes (64 KiB)" {
			t.Errorf("Parse(%d bytes): %+v", len(src), p)
		}
	}
	// Checked first: refusing 2 MiB costs what refusing 64 KiB + 1 costs.
	if n := testing.AllocsPerRun(3, func() { policy.Parse(huge) }); n > 10 {
		t.Errorf("refusing a 2 MiB file: %.0f allocations, want a handful (it was parsed)", n)
	}
	// Exactly 64 KiB is a policy file like any other.
	src := "max_attempts: 4\n#"
	src += strings.Repeat("x", 64<<10-len(src))
	if p, err := policy.Parse([]byte(src)); err != nil || p.MaxAttempts() != 4 {
		t.Errorf("a 64 KiB file: %v", err)
	}
}

// Tables and lists over their limits are one problem each, naming the field
// and both numbers, not one problem per entry.
func TestParseBoundsTablesAndLists(t *testing.T) {
	kinds := func(prefix string, n int) string { // {"kind0": retryable, ...}
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, "%q: retryable, ", fmt.Sprint(prefix, i))
		}
		return "{" + strings.TrimSuffix(b.String(), ", ") + "}"
	}
	table := func(n int) string { return `{"classify": {"error_kinds": ` + kinds("kind", n) + `}}` }
	list := func(field string, n int) string {
		items := make([]string, n)
		for i := range items {
			items[i] = fmt.Sprintf("%q", fmt.Sprint("M", i))
		}
		return `{"idempotency": {"` + field + `": [` + strings.Join(items, ", ") + `]}}`
	}
	for _, c := range []struct{ src, field, reason string }{
		{table(1001), "classify.error_kinds", "must have at most 1000 entries (got 1001)"},
		{list("idempotent_methods", 101), "idempotency.idempotent_methods", "must have at most 100 items (got 101)"},
		{list("never_sent_kinds", 150), "idempotency.never_sent_kinds", "must have at most 100 items (got 150)"},
		// Merge keys cannot smuggle more entries in.
		{"classify:\n  error_kinds:\n    <<: [" + kinds("a", 600) + ", " + kinds("b", 600) + "]\n",
			"classify.error_kinds", "must have at most 1000 entries (got 1200)"},
	} {
		_, err := policy.Parse([]byte(c.src))
		var pe *policy.Error
		if !errors.As(err, &pe) || len(pe.Problems) != 1 {
			t.Errorf("%s: got %v, want one problem", c.field, err)
			continue
		}
		if p := pe.Problems[0]; p.Field != c.field || p.Reason != c.reason {
			t.Errorf("got %s: %s, want %s: %s", p.Field, p.Reason, c.field, c.reason)
		}
	}
	for _, src := range []string{table(1000), list("idempotent_methods", 100), list("never_sent_kinds", 100)} {
		if _, err := policy.Parse([]byte(src)); err != nil {
			t.Errorf("at the limit: %v", err)
		}
	}
}

// Thousands of problems are reported as the first 20 and a count, not as
// thousands of lines.
func TestParseListsTheFirst20ProblemsAndCountsTheRest(t *testing.T) {
	var b strings.Builder
	for i := range 5000 {
		fmt.Fprintf(&b, "k%d: 0\n", i)
	}
	_, err := policy.Parse([]byte(b.String()))
	var pe *policy.Error
	if !errors.As(err, &pe) {
		t.Fatalf("got %v", err)
	}
	if len(pe.Problems) != 20 || pe.Problems[0].Field != "k0" || pe.Problems[19].Field != "k19" {
		t.Fatalf("%d problems listed, want the first 20", len(pe.Problems))
	}
	if msg := err.Error(); !strings.HasSuffix(msg, "; k19: unknown field; and 4980 more problems") || strings.Count(msg, "; ") != 20 {
		t.Errorf("message %q", msg[max(0, len(msg)-100):])
	}
	// One over the limit says "problem".
	b.Reset()
	for i := range 21 {
		fmt.Fprintf(&b, "k%d: 0\n", i)
	}
	if _, err := policy.Parse([]byte(b.String())); err == nil || !strings.HasSuffix(err.Error(), "; and 1 more problem") {
		t.Errorf("21 problems: %v", err)
	}
}
