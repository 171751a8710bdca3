package policy_test

import (
	"errors"
	"math/rand/v2"
	"net/http"
	"testing"
	"time"

	"github.com/backstop-dev/backstop/policy"
)

func TestParseErrorsNameTheFieldAndReason(t *testing.T) {
	cases := []struct{ src, field, reason string }{
		{`{"backoff": {"base": "1s", "cap": "100ms"}}`, "backoff.cap", "must be >= backoff.base (got 100ms < 1s)"},
		{`{"backoff": {"bsae": "1s"}}`, "backoff.bsae", "unknown field"},
		{`{"max_attempts": "five"}`, "max_attempts", `must be an integer (got "five")`},
		{`{"max_attempts": 2.5}`, "max_attempts", "must be an integer"},
		{`{"max_attempts": -1}`, "max_attempts", "must be in 0..1000000 (got -1)"},
		{`{"max_attempts": 0}`, "max_attempts", "unless max_elapsed is set"},
		{`{"max_elapsed": 30}`, "max_elapsed", "must be a duration"},
		{`{"max_elapsed": "-1s"}`, "max_elapsed", "must not be negative"},
		{`{"attempt_timeout": "-1s"}`, "attempt_timeout", "must not be negative"},
		{`{"attempt_timeout": 5}`, "attempt_timeout", "must be a duration"},
		{`{"attempt_timeout": "2562048h"}`, "attempt_timeout", "must be at most 2562047h47m16.854s (got 2562048h)"},
		{`{"connect_timeout": "-1s"}`, "connect_timeout", "must not be negative"},
		{`{"connect_timeout": 5}`, "connect_timeout", "must be a duration"},
		{`{"connect_timeout": "1.5ms"}`, "connect_timeout", "whole number of milliseconds"},
		{`{"max_elapsed": "2562048h"}`, "max_elapsed", "must be at most 2562047h47m16.854s (got 2562048h)"},
		{`{"backoff": {"cap": "9999999999999999999ms"}}`, "backoff.cap", "must be at most 2562047h47m16.854s"},
		{`{"max_elapsed": "-2562048h"}`, "max_elapsed", "must not be negative (got -2562048h)"},
		{`{"max_elapsed": "1.2.3h"}`, "max_elapsed", "must be a duration"},
		{`{"max_elapsed": "1d"}`, "max_elapsed", "must be a duration"},
		{`{"backoff": {"base": "1.5ms"}}`, "backoff.base", "whole number of milliseconds"},
		{`{"backoff": {"strategy": "fibonacci"}}`, "backoff.strategy", `must be one of none, constant, linear, exponential, decorrelated, cloud_tasks (got "fibonacci")`},
		{`{"backoff": {"multiplier": 1.23456}}`, "backoff.multiplier", "at most 3 decimal places"},
		{`{"backoff": {"multiplier": "2"}}`, "backoff.multiplier", "decimal number"},
		{`{"backoff": {"base": "0s"}}`, "backoff.base", "must be > 0 for strategy exponential"},
		{`{"jitter": {"mode": "decorrelated"}}`, "jitter.mode", "goes with the decorrelated strategy only"},
		{`{"jitter": {"mode": "proportional"}}`, "jitter.ratio", "must be > 0"},
		{`{"jitter": {"mode": "proportional", "ratio": 1.5}}`, "jitter.ratio", "must be in 0..1"},
		{`{"retry_after": {"on_exceed": "panic"}}`, "retry_after.on_exceed", "must be one of give_up, clamp, ignore"},
		{`{"retry_after": {"honor": "yes"}}`, "retry_after.honor", "must be true or false"},
		{`{"classify": {"http": {"999": "retryable"}}}`, "classify.http.999", "HTTP status 100..599"},
		{`{"classify": {"http": {"503": "maybe"}}}`, "classify.http.503", "must be one of retryable, permanent, uncertain"},
		{`{"classify": {"grpc": {"UNAVAILABLE": "retryable", "14": "permanent"}}}`, "classify.grpc.14", "duplicate key"},
		{`{"classify": {"grpc": {"NOPE": "retryable"}}}`, "classify.grpc.NOPE", "gRPC status name"},
		{`{"idempotency": {"idempotent_methods": "GET"}}`, "idempotency.idempotent_methods", "must be a list of strings"},
		{`{"idempotency": {"idempotent_methods": ["GET", ""]}}`, "idempotency.idempotent_methods[1]", "must not be empty"},
		{`{"retry_budget": {"type": "ratio", "window": "90s"}}`, "retry_budget.window", "1s..60s"},
		{`{"retry_budget": {"type": "token_bucket", "max_tokens": 1, "token_ratio": 2}}`, "retry_budget.token_ratio", "must be <= retry_budget.max_tokens"},
		{`{"circuit_breaker": {"failure_threshold": 0}}`, "circuit_breaker.failure_threshold", "must be in 1..1000000"},
		{`{"circuit_breaker": {"open_for": "0s"}}`, "circuit_breaker.open_for", "must be > 0"},
		{`{"extends": "nightly"}`, "extends", `unknown preset "nightly"`},
		{`{"max_attempts": 3, "max_attempts": 4}`, "max_attempts", "duplicate key"},
		{`[1, 2]`, "(document)", "must be an object"},
		{`{"backoff": [1]}`, "backoff", "must be an object"},
		{`{"backoff": null}`, "backoff", "must be an object"},
		{`{`, "(document)", ""},
		{``, "(document)", "must be a JSON or YAML object"},
	}
	for _, c := range cases {
		_, err := policy.Parse([]byte(c.src))
		if err == nil {
			t.Errorf("Parse(%s): no error, want %s: %s", c.src, c.field, c.reason)
			continue
		}
		wantProblem(t, err, c.field, c.reason)
	}
}

func TestParseReportsEveryProblemWithLines(t *testing.T) {
	src := "max_attempts: x\nbackoff:\n  base: 1s\n  cap: 10ms\n  colour: red\n"
	_, err := policy.Parse([]byte(src))
	var pe *policy.Error
	if !errors.As(err, &pe) || len(pe.Problems) != 3 {
		t.Fatalf("got %v, want 3 problems", err)
	}
	want := map[string]int{"max_attempts": 1, "backoff.colour": 5, "backoff.cap": 4}
	for _, p := range pe.Problems {
		if want[p.Field] != p.Line {
			t.Errorf("%s reported at line %d, want %d", p.Field, p.Line, want[p.Field])
		}
	}
}

func TestYAMLAndJSONAreTheSamePolicy(t *testing.T) {
	j := mustParse(t, `{"max_attempts": 4, "backoff": {"strategy": "linear", "base": "2s", "cap": "9s"}, "jitter": {"mode": "none"}, "classify": {"http": {"404": "retryable"}}}`)
	y := mustParse(t, "max_attempts: 4\nbackoff:\n  strategy: linear\n  base: 2s\n  cap: 9s\njitter:\n  mode: none\nclassify:\n  http:\n    404: retryable\n")
	for a := int64(1); a <= 5; a++ {
		f := policy.Failure{Attempt: a, HTTPStatus: 404}
		if dj, dy := mustDecide(t, j, f), mustDecide(t, y, f); dj != dy {
			t.Errorf("attempt %d: JSON %+v, YAML %+v", a, dj, dy)
		}
	}
	if d := mustDecide(t, j, policy.Failure{Attempt: 3, HTTPStatus: 404}); d.DelayMs != 6000 {
		t.Errorf("linear third retry: %+v, want 6000ms", d)
	}
}

func TestExtendsStartsFromThePreset(t *testing.T) {
	p := mustParse(t, `{"extends": "critical", "max_attempts": 4}`)
	if p.MaxAttempts() != 4 || p.Backoff(10, 0, 1) != 2000 {
		t.Errorf("extends critical: attempts %d, cap %d", p.MaxAttempts(), p.Backoff(10, 0, 1))
	}
}

func TestClassifyOverridesRangesThenCodes(t *testing.T) {
	p := mustParse(t, `{"classify": {"http": {"503": "retryable", "5xx": "permanent"}, "error_kinds": {"throttled": "retryable"}, "default": "permanent"}}`)
	for _, c := range []struct {
		f    policy.Failure
		want policy.Class
	}{
		{policy.Failure{Attempt: 1, HTTPStatus: 503}, policy.Retryable},
		{policy.Failure{Attempt: 1, HTTPStatus: 502}, policy.Permanent},
		{policy.Failure{Attempt: 1, HTTPStatus: 429}, policy.Retryable},
		{policy.Failure{Attempt: 1, ErrorKind: "throttled"}, policy.Retryable},
		{policy.Failure{Attempt: 1, ErrorKind: "mystery"}, policy.Permanent},
	} {
		if d := mustDecide(t, p, c.f); d.Class != c.want {
			t.Errorf("%+v: class %s, want %s", c.f, d.Class, c.want)
		}
	}
}

// The allocation-free HTTP-date parser agrees with net/http on every form.
func TestRetryAfterDatesAgreeWithNetHTTP(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	for i := 0; i < 5000; i++ {
		at := time.Unix(rng.Int64N(4_000_000_000), 0).UTC()
		now := at.Add(-time.Duration(rng.Int64N(3600)) * time.Second)
		for _, layout := range []string{http.TimeFormat, time.RFC850, time.ANSIC} {
			s := at.Format(layout)
			if layout == time.RFC850 {
				s = at.Format("Monday, 02-Jan-06 15:04:05 GMT")
				if at.Year() >= 2069 {
					continue // net/http reads 69..99 as 19xx; RFC 9110 reads them relative to now
				}
			}
			want, err := http.ParseTime(s)
			if err != nil {
				t.Fatalf("net/http cannot parse %q: %v", s, err)
			}
			got, ok := policy.ParseRetryAfter(s, now.UnixMilli())
			if !ok || got != want.Sub(now).Milliseconds() {
				t.Fatalf("ParseRetryAfter(%q) = %d, %v; want %d", s, got, ok, want.Sub(now).Milliseconds())
			}
		}
	}
}

func TestRFC850TwoDigitYearIsRelativeToNow(t *testing.T) {
	at := func(y int, m time.Month, d int) int64 { return time.Date(y, m, d, 0, 0, 0, 0, time.UTC).UnixMilli() }
	for _, c := range []struct {
		v      string
		now    int64
		wantMs int64
		wantOK bool
	}{
		// 50 years ahead stays in this century: a hint of 50 years is absurd.
		{"Sunday, 01-Feb-76 00:00:00 GMT", at(2026, 1, 1), 0, false},
		// 51 years ahead means the past century: a past date, retry now.
		{"Monday, 01-Feb-77 00:00:00 GMT", at(2026, 1, 1), 0, true},
		{"Monday, 01-Feb-27 00:00:00 GMT", at(2027, 1, 31), 86_400_000, true},
		{"Friday, 01-Jan-00 00:00:00 GMT", at(1999, 12, 31), 86_400_000, true},
	} {
		got, ok := policy.ParseRetryAfter(c.v, c.now)
		if ok != c.wantOK || got != c.wantMs {
			t.Errorf("ParseRetryAfter(%q) = %d, %v; want %d, %v", c.v, got, ok, c.wantMs, c.wantOK)
		}
	}
}
