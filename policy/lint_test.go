package policy_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/backstop-dev/backstop/policy"
)

func lintsOf(t *testing.T, src string) []policy.Lint {
	t.Helper()
	p, err := policy.Parse([]byte(src))
	if err != nil {
		t.Fatalf("%s: %v", src, err)
	}
	return p.Lints()
}

func TestLintsFireOnTheAntiPatterns(t *testing.T) {
	cases := []struct {
		name, src, code, field, says string
	}{
		{"immediate retry", `{"backoff": {"strategy": "none"}}`, "BP001", "backoff.strategy", "an immediate retry"},
		{"no jitter, exponential", `{"jitter": {"mode": "none"}}`, "BP002", "jitter.mode", "backoff without jitter"},
		{"no jitter, linear", `{"backoff": {"strategy": "linear"}, "jitter": {"mode": "none"}}`, "BP002", "jitter.mode", "with linear backoff"},
		{"no jitter, cloud_tasks", `{"backoff": {"strategy": "cloud_tasks", "base": "100ms", "cap": "1h"}, "jitter": {"mode": "none"}}`, "BP002", "jitter.mode", "with cloud_tasks backoff"},
		{"12 attempts", `{"max_attempts": 12}`, "BP003", "max_attempts", "12 attempts are 11 retries: more than 10 retries needs a reason"},
		{"unlimited attempts", `{"max_attempts": 0, "max_elapsed": "1h"}`, "BP003", "max_attempts", "unlimited attempts"},
		{"timeout past the first backoff", `{"attempt_timeout": "30s"}`, "BP004", "attempt_timeout", "attempt_timeout 30s is longer than the first backoff (1s): keep timeouts much shorter than the backoff cycle"},
		{"unknown errors retryable", `{"classify": {"default": "retryable"}}`, "BP005", "classify.default", "retryable and retried up to 4 times: default is no retry"},
		{"unknown errors uncertain, 3 attempts", `{"uncertain": {"max_attempts": 3}}`, "BP005", "classify.default", "uncertain and retried up to 2 times"},
		{"connect timeout as long as the attempt", `{"attempt_timeout": "1s", "connect_timeout": "1s"}`, "BP006", "connect_timeout", "connect_timeout 1s is not shorter than attempt_timeout (1s)"},
		{"connect timeout past the attempt", `{"attempt_timeout": "500ms", "connect_timeout": "2s"}`, "BP006", "connect_timeout", "so connect_timeout never applies"},
		{"unknown errors retryable, no attempt limit", `{"max_attempts": 0, "max_elapsed": "1h", "classify": {"default": "retryable"}}`, "BP005", "classify.default", "without an attempt limit"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var found *policy.Lint
			for _, l := range lintsOf(t, c.src) {
				if l.Code == c.code {
					found = &l
				}
			}
			if found == nil {
				t.Fatalf("%s: no %s in %v", c.src, c.code, lintsOf(t, c.src))
			}
			if found.Field != c.field || !strings.Contains(found.Message, c.says) {
				t.Errorf("%s: got %v, want field %s and a message with %q", c.src, found, c.field, c.says)
			}
			if strings.Contains(found.Message, "\n") {
				t.Errorf("%s: the message is more than one line: %q", c.code, found.Message)
			}
		})
	}
}

func TestLintsStaySilent(t *testing.T) {
	for _, src := range []string{
		`{}`,
		`{"max_attempts": 1, "backoff": {"strategy": "none"}}`,      // never retries
		`{"max_attempts": 1, "classify": {"default": "retryable"}}`, // never retries
		`{"max_attempts": 11}`,          // 10 retries
		`{"jitter": {"mode": "equal"}}`, // jitter
		`{"backoff": {"strategy": "decorrelated"}, "jitter": {"mode": "decorrelated"}}`,
		`{"attempt_timeout": "1s"}`,                               // equal to the first backoff
		`{"attempt_timeout": "200ms", "backoff": {"base": "1s"}}`, // shorter
		`{"classify": {"default": "permanent"}, "uncertain": {"max_attempts": 4}}`,
		`{"attempt_timeout": "1s", "connect_timeout": "200ms"}`,     // a fraction of the attempt
		`{"connect_timeout": "3s"}`,                                 // no attempt_timeout to compare
		`{"classify": {"default": "uncertain"}}`,                    // one retry, the built-in bound
		`{"max_attempts": 2, "classify": {"default": "retryable"}}`, // one retry
		`{"max_attempts": 50, "lint_ignore": {"BP003": "a partner's nightly maintenance lasts an hour"}}`,
		`{"backoff": {"strategy": "none"}, "lint_ignore": {"BP001": "a local lock: the retry is the wait"}}`,
	} {
		if got := lintsOf(t, src); len(got) != 0 {
			t.Errorf("%s: got %v, want no lint", src, got)
		}
	}
}

func TestLintIgnoreSilencesOnlyItsCode(t *testing.T) {
	got := lintsOf(t, `{"max_attempts": 20, "jitter": {"mode": "none"}, "lint_ignore": {"BP003": "a day of retries, paged on"}}`)
	if len(got) != 1 || got[0].Code != "BP002" {
		t.Errorf("got %v, want BP002 alone", got)
	}
	// A preset's reasons come along with extends; the file adds its own.
	got = lintsOf(t, `{"extends": "batch", "backoff": {"strategy": "none"}, "lint_ignore": {"BP001": "tests"}}`)
	if len(got) != 0 {
		t.Errorf("extends batch: got %v, want none", got)
	}
}

func TestLintIgnoreIsValidated(t *testing.T) {
	for _, c := range []struct{ src, field, reason string }{
		{`{"lint_ignore": {"BP999": "x"}}`, "lint_ignore.BP999", "unknown lint code (codes: BP001, BP002, BP003, BP004, BP005, BP006)"},
		{`{"lint_ignore": {"BP003": ""}}`, "lint_ignore.BP003", "must state the reason"},
		{`{"lint_ignore": {"BP003": 3}}`, "lint_ignore.BP003", "must be a string"},
		{`{"lint_ignore": ["BP003"]}`, "lint_ignore", "must be an object"},
		{"lint_ignore:\n  BP003: a\n  BP003: b\n", "lint_ignore.BP003", "duplicate key"},
	} {
		_, err := policy.Parse([]byte(c.src))
		var pe *policy.Error
		if !errors.As(err, &pe) || pe.Problems[0].Field != c.field || !strings.Contains(pe.Problems[0].Reason, c.reason) {
			t.Errorf("%s: got %v, want %s: %s", c.src, err, c.field, c.reason)
		}
	}
}

func TestPresetsHaveNoLint(t *testing.T) {
	for _, name := range policy.PresetNames() {
		p, err := policy.Preset(name)
		if err != nil {
			t.Fatal(err)
		}
		if got := p.Lints(); len(got) != 0 {
			t.Errorf("preset %s: %v", name, got)
		}
	}
}

// connect_timeout is read as written, described, and left out (0) when
// absent: the client's own connect timeout applies then.
func TestConnectTimeout(t *testing.T) {
	p, err := policy.Parse([]byte(`{"attempt_timeout": "2s", "connect_timeout": "250ms"}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := p.ConnectTimeoutMs(); got != 250 {
		t.Errorf("ConnectTimeoutMs() = %d, want 250", got)
	}
	if s := p.String(); !strings.Contains(s, "each attempt at most 2s, each connect at most 250ms") {
		t.Errorf("String() = %q: no connect timeout", s)
	}
	for _, name := range policy.PresetNames() {
		p, err := policy.Preset(name)
		if err != nil {
			t.Fatal(err)
		}
		if got := p.ConnectTimeoutMs(); got != 0 {
			t.Errorf("preset %s: ConnectTimeoutMs() = %d, want 0", name, got)
		}
	}
}
