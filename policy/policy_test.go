package policy_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/backstop-dev/backstop/policy"
)

func mustParse(t testing.TB, src string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte(src))
	if err != nil {
		t.Fatalf("Parse(%s): %v", src, err)
	}
	return p
}

func mustDecide(t testing.TB, p *policy.Policy, f policy.Failure) policy.Decision {
	t.Helper()
	d, err := p.Decide(f)
	if err != nil {
		t.Fatalf("Decide(%+v): %v", f, err)
	}
	return d
}

var combos = []struct{ strategy, jitter string }{
	{"none", "none"}, {"constant", "full"}, {"linear", "none"}, {"linear", "equal"},
	{"exponential", "none"}, {"exponential", "full"}, {"exponential", "equal"},
	{"exponential", "proportional"}, {"decorrelated", "decorrelated"}, {"decorrelated", "none"},
}

func comboPolicy(t testing.TB, strategy, jitter, mult string) *policy.Policy {
	return mustParse(t, fmt.Sprintf(`{"max_attempts": 0, "max_elapsed": "100000h",
		"backoff": {"strategy": %q, "base": "250ms", "cap": "45s", "multiplier": %s, "max_doublings": 1000},
		"jitter": {"mode": %q, "ratio": 0.5}}`, strategy, mult, jitter))
}

// Libraries overflow to zero, negative or maximal delays at large attempt
// numbers; here every delay stays within [0, cap] and exponential without
// jitter sits at the cap.
func TestLargeAttemptsNeverOverflow(t *testing.T) {
	randoms := []float64{0, 0.5, 0.999, 1, math.NaN(), math.Inf(1), math.Inf(-1), -3, 7}
	for _, c := range combos {
		for _, mult := range []string{"2", "1.5", "10"} {
			p := comboPolicy(t, c.strategy, c.jitter, mult)
			for _, a := range []int64{1024, 1025, 1e9, math.MaxInt64} {
				for _, r := range randoms {
					for _, prev := range []int64{0, 45_000, math.MaxInt64} {
						d := mustDecide(t, p, policy.Failure{Attempt: a, HTTPStatus: 503, Random: r, PrevDelayMs: prev})
						if d.Action != policy.Retry || d.DelayMs < 0 || d.DelayMs > 45_000 {
							t.Fatalf("%s/%s ×%s attempt %d r=%v prev=%d: %+v", c.strategy, c.jitter, mult, a, r, prev, d)
						}
						if c.strategy == "exponential" && c.jitter == "none" && d.DelayMs != 45_000 {
							t.Fatalf("exponential attempt %d: delay %d, want the cap", a, d.DelayMs)
						}
					}
				}
			}
		}
	}
}

func TestZeroMultiplierRejected(t *testing.T) {
	_, err := policy.Parse([]byte(`{"backoff": {"multiplier": 0}}`))
	wantProblem(t, err, "backoff.multiplier", "must be in 1..1000")
}

// elapsed + delay must not wrap around and let a limit accept a wait of
// centuries.
func TestElapsedPlusDelayDoesNotOverflow(t *testing.T) {
	p := mustParse(t, `{"max_attempts": 0, "max_elapsed": "1h", "jitter": {"mode": "none"}}`)
	for _, e := range []int64{math.MaxInt64, math.MaxInt64 - 1, math.MaxInt64 - 1000, 3_600_001} {
		d := mustDecide(t, p, policy.Failure{Attempt: 3, HTTPStatus: 503, ElapsedMs: e})
		if d.Action != policy.DeadLetter || d.Reason != policy.MaxElapsedExceeded {
			t.Errorf("elapsed %d: %+v, want dead_letter max_elapsed_exceeded", e, d)
		}
	}
}

// A jittered delay never exceeds the cap, and the decorrelated chain never
// spikes, goes negative or leaves [base, cap] over thousands of steps.
func TestJitterStaysWithinBounds(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for _, c := range combos {
		p := comboPolicy(t, c.strategy, c.jitter, "2")
		prev := int64(0)
		for i := 0; i < 5000; i++ {
			a := int64(1 + i)
			d := mustDecide(t, p, policy.Failure{Attempt: a, HTTPStatus: 503, Random: rng.Float64(), PrevDelayMs: prev})
			if d.DelayMs < 0 || d.DelayMs > 45_000 {
				t.Fatalf("%s/%s attempt %d: delay %d outside [0, 45000]", c.strategy, c.jitter, a, d.DelayMs)
			}
			if c.strategy == "decorrelated" && d.DelayMs < 250 {
				t.Fatalf("decorrelated attempt %d: delay %d below base", a, d.DelayMs)
			}
			prev = d.DelayMs
		}
	}
}

func TestRetryAfterIsAFloorNeverShortenedByJitter(t *testing.T) {
	p := mustParse(t, `{"max_attempts": 10, "backoff": {"base": "1s", "cap": "60s"}, "jitter": {"mode": "full"}}`)
	for i := 0; i < 1000; i++ {
		r := float64(i) / 1000
		d := mustDecide(t, p, policy.Failure{Attempt: 1 + int64(i%9), HTTPStatus: 429, RetryAfter: "30", Random: r})
		if d.Action != policy.Retry || d.DelayMs < 30_000 {
			t.Fatalf("r=%v: %+v, want a retry no sooner than 30s", r, d)
		}
	}
}

// A Retry-After past the remaining time budget gives up with its own reason
// instead of silently disabling retries (or sleeping past the deadline).
func TestRetryAfterPastDeadlineGivesUpWithReason(t *testing.T) {
	p := mustParse(t, `{"max_attempts": 10, "max_elapsed": "5m", "jitter": {"mode": "none"}}`)
	d := mustDecide(t, p, policy.Failure{Attempt: 1, HTTPStatus: 503, RetryAfter: "600"})
	if d.Action != policy.DeadLetter || d.Reason != policy.RetryAfterTooLong {
		t.Fatalf("got %+v, want dead_letter retry_after_too_long", d)
	}
	// The next failure without a hint still retries: nothing was disabled.
	d = mustDecide(t, p, policy.Failure{Attempt: 2, HTTPStatus: 503})
	if d.Action != policy.Retry {
		t.Fatalf("got %+v, want retry", d)
	}
}

// Absurd or past hints neither crash nor stall a worker.
func TestAbsurdRetryAfterFallsBackToComputedDelay(t *testing.T) {
	p := mustParse(t, `{"max_attempts": 10, "jitter": {"mode": "none"}, "retry_after": {"mode": "hint"}}`)
	const now = 1767225600000
	for _, v := range []string{"9999999999", "99999999999999999999999999", "-1", "soon", "1e3", "Thu, 01 Jan 2026 00:00:00 UTC"} {
		d := mustDecide(t, p, policy.Failure{Attempt: 2, HTTPStatus: 503, RetryAfter: v, NowMs: now})
		if d.Action != policy.Retry || d.DelayMs != 2000 || d.Reason != policy.Transient {
			t.Errorf("Retry-After %q: %+v, want retry after the computed 2000ms", v, d)
		}
	}
	d := mustDecide(t, p, policy.Failure{Attempt: 2, HTTPStatus: 503, RetryAfter: "Wed, 31 Dec 2025 23:00:00 GMT", NowMs: now})
	if d.Action != policy.Retry || d.DelayMs != 0 || d.Reason != policy.RetryAfterHint {
		t.Errorf("past HTTP-date: %+v, want an immediate retry", d)
	}
}

// The last retry is never scheduled past the max-elapsed deadline.
func TestStopsBeforeTheDeadline(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	p := mustParse(t, `{"max_attempts": 0, "max_elapsed": "30s", "backoff": {"base": "100ms", "cap": "10s"}}`)
	for i := 0; i < 20_000; i++ {
		f := policy.Failure{Attempt: 1 + rng.Int64N(40), HTTPStatus: 503, ElapsedMs: rng.Int64N(32_000), Random: rng.Float64()}
		if rng.IntN(3) == 0 {
			f.RetryAfter = fmt.Sprint(rng.IntN(40))
		}
		d := mustDecide(t, p, f)
		if d.Action == policy.Retry && f.ElapsedMs+d.DelayMs > 30_000 {
			t.Fatalf("%+v scheduled at %dms, past the 30s deadline", f, f.ElapsedMs+d.DelayMs)
		}
	}
}

func TestIdempotencyGate(t *testing.T) {
	p, _ := policy.Preset("default")
	cases := []struct {
		f    policy.Failure
		want policy.Reason
	}{
		{policy.Failure{Attempt: 1, Method: "POST", HTTPStatus: 503}, policy.NotIdempotent},
		{policy.Failure{Attempt: 1, Method: "PATCH", ErrorKind: "timeout"}, policy.NotIdempotent},
		{policy.Failure{Attempt: 1, Method: "post", ErrorKind: "connection_reset"}, policy.NotIdempotent},
		{policy.Failure{Attempt: 1, Method: "BREW", HTTPStatus: 503}, policy.NotIdempotent},
		// never sent: safe to retry whatever the method
		{policy.Failure{Attempt: 1, Method: "POST", ErrorKind: "connection_refused"}, policy.Transient},
		{policy.Failure{Attempt: 1, Method: "POST", ErrorKind: "dns_temporary"}, policy.Transient},
		// an idempotency key makes it safe
		{policy.Failure{Attempt: 1, Method: "POST", IdempotencyKey: "order-42", HTTPStatus: 503}, policy.Transient},
		{policy.Failure{Attempt: 1, Method: "PUT", HTTPStatus: 503}, policy.Transient},
		{policy.Failure{Attempt: 1, Method: "GET", HTTPStatus: 503}, policy.Transient},
	}
	for _, c := range cases {
		if d := mustDecide(t, p, c.f); d.Reason != c.want {
			t.Errorf("%s %s/%d: reason %s, want %s", c.f.Method, c.f.ErrorKind, c.f.HTTPStatus, d.Reason, c.want)
		}
	}
}

// Two policies parsed from the same bytes have their own budget and
// breaker; permanent errors never drain the budget or trip the breaker.
func TestStateIsNeverShared(t *testing.T) {
	src := `{"retry_budget": {"type": "token_bucket", "max_tokens": 4, "token_ratio": 1},
		"circuit_breaker": {"failure_threshold": 2, "open_for": "1m"}}`
	a, b := mustParse(t, src), mustParse(t, src)
	const now = 1_000_000
	for i := 0; i < 100; i++ {
		if d := mustDecide(t, a, policy.Failure{Attempt: 1, HTTPStatus: 400, NowMs: now}); d.Reason != policy.PermanentError {
			t.Fatalf("400: %+v", d)
		}
	}
	if d := mustDecide(t, a, policy.Failure{Attempt: 1, HTTPStatus: 503, NowMs: now}); d.Action != policy.Retry {
		t.Fatalf("after 100 permanent errors the budget must be intact: %+v", d)
	}
	if d := mustDecide(t, a, policy.Failure{Attempt: 1, HTTPStatus: 503, NowMs: now}); d.Reason != policy.CircuitOpen {
		t.Fatalf("second transient failure should open the breaker: %+v", d)
	}
	if s := b.CircuitState(now); s != policy.BreakerClosed {
		t.Fatalf("policy b's breaker is %s: state leaked between policies", s)
	}
	if d := mustDecide(t, b, policy.Failure{Attempt: 1, HTTPStatus: 503, NowMs: now}); d.Action != policy.Retry {
		t.Fatalf("policy b: %+v", d)
	}
}

func TestCircuitBreakerCycle(t *testing.T) {
	p := mustParse(t, `{"circuit_breaker": {"failure_threshold": 2, "open_for": "10s", "half_open_successes": 2}}`)
	fail := func(now int64) policy.Decision {
		return mustDecide(t, p, policy.Failure{Attempt: 1, GRPCCode: 14, NowMs: 1_000_000 + now})
	}
	fail(0)
	if d := fail(1); d.Reason != policy.CircuitOpen || p.CircuitState(1_000_001) != policy.BreakerOpen {
		t.Fatalf("want open after 2 failures, got %+v / %s", d, p.CircuitState(1_000_001))
	}
	if s := p.CircuitState(1_010_001); s != policy.BreakerHalfOpen {
		t.Fatalf("after open_for: %s, want half_open", s)
	}
	p.RecordSuccess(1_010_002)
	if s := p.CircuitState(1_010_003); s != policy.BreakerHalfOpen {
		t.Fatalf("one of two successes: %s, want half_open", s)
	}
	p.RecordSuccess(1_010_004)
	if s := p.CircuitState(1_010_005); s != policy.BreakerClosed {
		t.Fatalf("after two successes: %s, want closed", s)
	}
}

func TestStatefulPolicyNeedsNow(t *testing.T) {
	p := mustParse(t, `{"circuit_breaker": {"failure_threshold": 1}}`)
	_, err := p.Decide(policy.Failure{Attempt: 1, HTTPStatus: 503})
	var ie *policy.InputError
	if !errors.As(err, &ie) || ie.Field != "now_ms" {
		t.Fatalf("got %v, want an InputError for now_ms", err)
	}
	if s := p.CircuitState(1); s != policy.BreakerClosed {
		t.Fatalf("a refused failure changed the breaker: %s", s)
	}
}

func TestMultiplierGrowsFromASmallBase(t *testing.T) {
	p := mustParse(t, `{"max_attempts": 30, "backoff": {"base": "1ms", "multiplier": 1.5, "cap": "1h", "max_doublings": 62}, "jitter": {"mode": "none"}}`)
	// 1.5^18 = 1477.9: the value is kept in thousandths, not floored each step.
	if got := p.Backoff(19, 0, 0); got != 1477 {
		t.Fatalf("attempt 19: %d ms, want 1477", got)
	}
}

func TestInvalidInputIsAnError(t *testing.T) {
	p, _ := policy.Preset("default")
	for _, f := range []policy.Failure{
		{Attempt: 0}, {Attempt: -5}, {Attempt: 1, HTTPStatus: 42}, {Attempt: 1, GRPCCode: 99},
		{Attempt: 1, ElapsedMs: -1}, {Attempt: 1, NowMs: -1}, {Attempt: 1, PrevDelayMs: -1},
	} {
		_, err := p.Decide(f)
		var ie *policy.InputError
		if !errors.As(err, &ie) || ie.Field == "" {
			t.Errorf("Decide(%+v) = %v, want an *InputError naming the field", f, err)
		}
	}
}

func TestDecideDoesNotAllocate(t *testing.T) {
	p, _ := policy.Preset("default")
	fs := []policy.Failure{
		{Attempt: 3, HTTPStatus: 503, Random: 0.3},
		{Attempt: 2, HTTPStatus: 429, RetryAfter: "Thu, 01 Jan 2026 00:00:45 GMT", NowMs: 1767225600000, Random: 0.3},
		{Attempt: 2, GRPCCode: 14, RetryPushback: "250", Method: "POST", ErrorKind: "connection_refused"},
		{Attempt: 2, ErrorKind: "deadlock", Method: "GET"},
	}
	for _, f := range fs {
		if n := testing.AllocsPerRun(100, func() { _, _ = p.Decide(f) }); n != 0 {
			t.Errorf("Decide(%+v) allocates %v times", f, n)
		}
	}
}

func TestPresets(t *testing.T) {
	for _, name := range policy.PresetNames() {
		p, err := policy.Preset(name)
		if err != nil {
			t.Fatalf("preset %s: %v", name, err)
		}
		if p.Name() != name || p.Stateful() {
			t.Errorf("preset %s: name %q stateful %v", name, p.Name(), p.Stateful())
		}
	}
	// default: base 1s, cap 300s, full jitter, 5 attempts.
	p, _ := policy.Preset("default")
	if p.MaxAttempts() != 5 || p.Backoff(1, 0, 1) != 1000 || p.Backoff(30, 0, 1) != 300_000 || p.Backoff(3, 0, 0) != 0 {
		t.Errorf("default preset: attempts %d, delays %d %d %d", p.MaxAttempts(), p.Backoff(1, 0, 1), p.Backoff(30, 0, 1), p.Backoff(3, 0, 0))
	}
	if _, err := policy.Preset("nope"); err == nil || !strings.Contains(err.Error(), "(presets: "+strings.Join(policy.PresetNames(), ", ")+")") {
		t.Errorf("unknown preset error should list the presets: %v", err)
	}
}

func wantProblem(t *testing.T, err error, field, reason string) {
	t.Helper()
	var pe *policy.Error
	if !errors.As(err, &pe) {
		t.Fatalf("got %v, want *policy.Error", err)
	}
	for _, p := range pe.Problems {
		if p.Field == field && strings.Contains(p.Reason, reason) {
			return
		}
	}
	t.Fatalf("problems %v: none is %s: %s", err, field, reason)
}
