package policy_test

import (
	"errors"
	"testing"

	"github.com/backstop-dev/backstop/policy"
)

// permitSeq is a breaker of threshold 2, open for 10s, admitting two trials.
const permitSeq = `{"circuit_breaker": {"failure_threshold": 2, "open_for": "10s", "half_open_max_calls": 2}}`

const t0 = int64(1_700_000_000_000)

func tripped(t *testing.T, src string) *policy.Policy {
	t.Helper()
	p := mustParse(t, src)
	for i := range int64(2) {
		mustDecide(t, p, policy.Failure{Attempt: 1, HTTPStatus: 503, NowMs: t0 + i})
	}
	if s := p.CircuitState(t0 + 1); s != policy.BreakerOpen {
		t.Fatalf("after two failures: %s, want open", s)
	}
	return p
}

func wantPermit(t *testing.T, p *policy.Policy, now int64, want policy.Permit) {
	t.Helper()
	if got := p.Acquire(now); got != want {
		t.Fatalf("Acquire(t0+%d) = %+v, want %+v", now-t0, got, want)
	}
}

func TestAcquireRefusesWhileOpen(t *testing.T) {
	p := tripped(t, permitSeq)
	// Opened at t0+1 for 10s: half-opens at t0+10001.
	wantPermit(t, p, t0+2, policy.Permit{RetryInMs: 9999, State: policy.BreakerOpen})
	wantPermit(t, p, t0+10_000, policy.Permit{RetryInMs: 1, State: policy.BreakerOpen})
}

func TestAcquireHalfOpenAdmitsExactlyMaxCalls(t *testing.T) {
	p := tripped(t, permitSeq)
	h := t0 + 10_001
	wantPermit(t, p, h, policy.Permit{Allowed: true, State: policy.BreakerHalfOpen})
	wantPermit(t, p, h+1, policy.Permit{Allowed: true, State: policy.BreakerHalfOpen})
	// Both trials out: refused until they report back or time out (h+10s).
	wantPermit(t, p, h+2, policy.Permit{RetryInMs: 9998, State: policy.BreakerHalfOpen})
	// A trial's success frees its slot (half_open_successes 1 closes, too).
	p.RecordSuccess(h + 3)
	wantPermit(t, p, h+4, policy.Permit{Allowed: true, State: policy.BreakerClosed})
}

func TestAcquireTrialSuccessFreesSlotUntilClosed(t *testing.T) {
	p := tripped(t, `{"circuit_breaker": {"failure_threshold": 2, "open_for": "10s", "half_open_successes": 2}}`)
	h := t0 + 10_001
	wantPermit(t, p, h, policy.Permit{Allowed: true, State: policy.BreakerHalfOpen})
	wantPermit(t, p, h+1, policy.Permit{RetryInMs: 9999, State: policy.BreakerHalfOpen})
	p.RecordSuccess(h + 2) // one of two successes: still half-open, slot free
	wantPermit(t, p, h+3, policy.Permit{Allowed: true, State: policy.BreakerHalfOpen})
	p.RecordSuccess(h + 4)
	wantPermit(t, p, h+5, policy.Permit{Allowed: true, State: policy.BreakerClosed})
}

func TestAcquireTrialFailureReopens(t *testing.T) {
	p := tripped(t, permitSeq)
	h := t0 + 10_001
	wantPermit(t, p, h, policy.Permit{Allowed: true, State: policy.BreakerHalfOpen})
	d := mustDecide(t, p, policy.Failure{Attempt: 1, HTTPStatus: 503, NowMs: h + 5})
	if d.Reason != policy.CircuitOpen {
		t.Fatalf("the trial's failure: %+v, want circuit_open", d)
	}
	wantPermit(t, p, h+6, policy.Permit{RetryInMs: 9999, State: policy.BreakerOpen})
}

// A trial that never reports back must not keep the breaker half-open (and
// every call refused) for good: after open_for it counts as failed.
func TestAcquireTrialTimesOut(t *testing.T) {
	p := tripped(t, permitSeq)
	h := t0 + 10_001
	wantPermit(t, p, h, policy.Permit{Allowed: true, State: policy.BreakerHalfOpen})
	wantPermit(t, p, h+1, policy.Permit{Allowed: true, State: policy.BreakerHalfOpen})
	wantPermit(t, p, h+9_999, policy.Permit{RetryInMs: 1, State: policy.BreakerHalfOpen})
	// At h+10s the round times out: reopened at h+10s, until h+20s.
	if s := p.CircuitState(h + 10_000); s != policy.BreakerOpen {
		t.Fatalf("timed-out trials: %s, want open", s)
	}
	wantPermit(t, p, h+10_001, policy.Permit{RetryInMs: 9_999, State: policy.BreakerOpen})
	// A late report changes nothing while open.
	p.RecordSuccess(h + 10_002)
	wantPermit(t, p, h+19_999, policy.Permit{RetryInMs: 1, State: policy.BreakerOpen})
	wantPermit(t, p, h+20_000, policy.Permit{Allowed: true, State: policy.BreakerHalfOpen})
}

// Callers that never acquire keep Decide's behaviour: half-open lets every
// call through and its first failure reopens.
func TestDecideWithoutAcquireUnchanged(t *testing.T) {
	p := tripped(t, permitSeq)
	h := t0 + 10_001
	for i := range int64(5) {
		if s := p.CircuitState(h + i); s != policy.BreakerHalfOpen {
			t.Fatalf("half-open without acquire at +%d: %s", i, s)
		}
	}
	if d := mustDecide(t, p, policy.Failure{Attempt: 1, HTTPStatus: 503, NowMs: h + 30_000}); d.Reason != policy.CircuitOpen {
		t.Fatalf("failure in half-open: %+v, want circuit_open", d)
	}
}

func TestAcquireStatelessAndBudgetOnly(t *testing.T) {
	for _, src := range []string{`{}`, `{"retry_budget": {"max_tokens": 1}}`} {
		p := mustParse(t, src)
		if got := p.Acquire(0); got != (policy.Permit{Allowed: true, State: policy.BreakerClosed}) {
			t.Fatalf("%s: %+v, want allowed", src, got)
		}
	}
}

func TestAcquireWithoutNowRefuses(t *testing.T) {
	p := mustParse(t, permitSeq)
	if got := p.Acquire(0); got.Allowed {
		t.Fatalf("Acquire(0) on a breaker: %+v, want refused", got)
	}
	// and it admitted nothing: the breaker is still closed and admits.
	wantPermit(t, p, t0, policy.Permit{Allowed: true, State: policy.BreakerClosed})
}

func TestOnOpenAndHalfOpenMaxCallsParse(t *testing.T) {
	if got := mustParse(t, `{}`).OnOpen(); got != policy.OnOpenDefer {
		t.Fatalf("default on_open %q", got)
	}
	if got := mustParse(t, `{"on_open": "dead_letter"}`).OnOpen(); got != policy.OnOpenDeadLetter {
		t.Fatalf("on_open %q", got)
	}
	for src, field := range map[string]string{
		`{"on_open": "drop"}`:                             "on_open",
		`{"circuit_breaker": {"half_open_max_calls": 0}}`: "circuit_breaker.half_open_max_calls",
	} {
		_, err := policy.Parse([]byte(src))
		var pe *policy.Error
		if !errors.As(err, &pe) || pe.Problems[0].Field != field {
			t.Fatalf("%s: %v, want an error naming %s", src, err, field)
		}
	}
}

// A half-open trial that ends with a permanent error (HTTP 400) gives its
// slot back: the dependency answered. It neither closes nor reopens the
// breaker (Resilience4j's ignored exceptions).
func TestAcquireTrialPermanentErrorReleasesSlot(t *testing.T) {
	p := tripped(t, `{"circuit_breaker": {"failure_threshold": 2, "open_for": "10s"}}`)
	h := t0 + 10_001
	wantPermit(t, p, h, policy.Permit{Allowed: true, State: policy.BreakerHalfOpen})
	d := mustDecide(t, p, policy.Failure{Attempt: 1, HTTPStatus: 400, NowMs: h + 1})
	if d.Reason != policy.PermanentError {
		t.Fatalf("400: %+v, want permanent_error", d)
	}
	wantPermit(t, p, h+2, policy.Permit{Allowed: true, State: policy.BreakerHalfOpen})
	// The second trial is out: the slot is taken again.
	wantPermit(t, p, h+3, policy.Permit{RetryInMs: 9999, State: policy.BreakerHalfOpen})
}

// Uncertain errors and not_idempotent refusals in half-open are failures
// of the trial: they reopen the breaker, so their slot is not left taken.
func TestAcquireTrialUncertainOrNotIdempotentReopens(t *testing.T) {
	for name, f := range map[string]policy.Failure{
		"uncertain":      {Attempt: 1, HTTPStatus: 500},
		"not_idempotent": {Attempt: 1, HTTPStatus: 503, Method: "POST"},
	} {
		t.Run(name, func(t *testing.T) {
			p := tripped(t, `{"circuit_breaker": {"failure_threshold": 2, "open_for": "10s"}}`)
			h := t0 + 10_001
			wantPermit(t, p, h, policy.Permit{Allowed: true, State: policy.BreakerHalfOpen})
			f.NowMs = h + 1
			if d := mustDecide(t, p, f); d.Action != policy.DeadLetter {
				t.Fatalf("%s: %+v, want dead_letter", name, d)
			}
			wantPermit(t, p, h+2, policy.Permit{RetryInMs: 9999, State: policy.BreakerOpen})
		})
	}
}

// budget_exhausted keeps the backoff the retry would have had, so a queue
// can defer the job by it.
func TestBudgetExhaustedCarriesBackoff(t *testing.T) {
	p := mustParse(t, `{"backoff": {"strategy": "constant", "base": "2s"}, "jitter": {"mode": "none"}, "max_attempts": 100,
		"retry_budget": {"max_tokens": 2, "token_ratio": 0.1}}`)
	var d policy.Decision
	for i := range int64(3) {
		d = mustDecide(t, p, policy.Failure{Attempt: 1, HTTPStatus: 503, NowMs: t0 + i})
	}
	if d.Reason != policy.BudgetExhausted || d.DelayMs != 2000 {
		t.Fatalf("budget refused: %+v, want budget_exhausted with delay 2000", d)
	}
}

func TestBudgetTokens(t *testing.T) {
	if _, ok := mustParse(t, `{}`).BudgetTokens(t0); ok {
		t.Fatal("no budget: ok")
	}
	p := mustParse(t, `{"retry_budget": {"max_tokens": 10, "token_ratio": 0.5}}`)
	want := func(now, milli int64) {
		t.Helper()
		if got, ok := p.BudgetTokens(now); !ok || got != milli {
			t.Fatalf("BudgetTokens = %d, %v; want %d", got, ok, milli)
		}
	}
	want(t0, 10_000)
	mustDecide(t, p, policy.Failure{Attempt: 1, HTTPStatus: 503, NowMs: t0})
	want(t0, 9_000)
	p.RecordSuccess(t0 + 1)
	want(t0+1, 9_500)

	// A window budget: the retries still allowed in the window.
	w := mustParse(t, `{"retry_budget": {"type": "ratio", "ratio": 0.5, "window": "10s", "min_retries_per_second": 0}}`)
	if got, _ := w.BudgetTokens(t0); got != 0 {
		t.Fatalf("empty window: %d, want 0", got)
	}
	for i := range int64(4) {
		w.RecordSuccess(t0 + i)
	}
	if got, _ := w.BudgetTokens(t0 + 5); got != 2_000 {
		t.Fatalf("4 requests at 0.5: %d, want 2000", got)
	}
	mustDecide(t, w, policy.Failure{Attempt: 1, HTTPStatus: 503, NowMs: t0 + 6}) // 5 requests, 1 retry
	if got, _ := w.BudgetTokens(t0 + 6); got != 1_000 {
		t.Fatalf("after one retry: %d, want 1000", got)
	}
}
