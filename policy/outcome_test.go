package policy_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/backstop-dev/backstop/policy"
)

// breakerSeq opens after two failures for 10s; its retries wait 100ms.
const breakerSeq = `{"max_attempts": 10, "backoff": {"strategy": "constant", "base": "100ms"}, "jitter": {"mode": "none"},
  "circuit_breaker": {"failure_threshold": 2, "open_for": "10s"}`

func breaker(onOpen string) string { return breakerSeq + `, "on_open": "` + onOpen + `"}` }

func before(now int64) policy.JobEvent {
	return policy.JobEvent{Event: policy.EventBefore, Failure: policy.Failure{NowMs: now}}
}

func succeeded(now int64) policy.JobEvent {
	return policy.JobEvent{Event: policy.EventSuccess, Failure: policy.Failure{NowMs: now}}
}

func failed(now int64, status int) policy.JobEvent {
	return policy.JobEvent{Event: policy.EventFailure, Failure: policy.Failure{Attempt: 1, HTTPStatus: status, NowMs: now, IdempotencyKey: "job-1"}}
}

func wantOutcome(t *testing.T, p *policy.Policy, e policy.JobEvent, want policy.Outcome) {
	t.Helper()
	got, err := p.Outcome(e)
	if err != nil {
		t.Fatalf("Outcome(%+v): %v", e, err)
	}
	if got != want {
		t.Fatalf("Outcome(%s at t0+%d) = %+v, want %+v", e.Event, e.Failure.NowMs-t0, got, want)
	}
}

var (
	run      = policy.Outcome{Action: policy.OutcomeRun}
	ack      = policy.Outcome{Action: policy.OutcomeAck, Reason: policy.Success, Count: policy.CountSuccess}
	retry100 = policy.Outcome{Action: policy.OutcomeRetry, Reason: policy.Transient, DelayMs: 100, Count: policy.CountRetry}
)

// Two failures open the breaker: the second's retry is refused
// (circuit_open) and deferred until it may half-open, pausing the worker;
// the next job is refused before it runs.
func TestOutcomeBreakerDefers(t *testing.T) {
	p := mustParse(t, breaker("defer"))
	wantOutcome(t, p, before(t0), run)
	wantOutcome(t, p, failed(t0, 503), retry100)
	wantOutcome(t, p, failed(t0+1, 503), policy.Outcome{Action: policy.OutcomeDefer, Reason: policy.CircuitOpen,
		DelayMs: 10_000, Pause: true, Count: policy.CountRetry})
	wantOutcome(t, p, before(t0+2), policy.Outcome{Action: policy.OutcomeDefer, Reason: policy.CircuitOpen,
		DelayMs: 9_999, Pause: true, Count: policy.CountRefused})
	// Half-open: one trial runs; the next waits for it; its success closes.
	wantOutcome(t, p, before(t0+10_001), run)
	wantOutcome(t, p, before(t0+10_002), policy.Outcome{Action: policy.OutcomeDefer, Reason: policy.CircuitOpen,
		DelayMs: 9_999, Pause: true, Count: policy.CountRefused})
	wantOutcome(t, p, succeeded(t0+10_003), ack)
	if s := p.CircuitState(t0 + 10_004); s != policy.BreakerClosed {
		t.Fatalf("after the trial's success: %s, want closed", s)
	}
	wantOutcome(t, p, before(t0+10_004), run)
}

// on_open dead_letter: the refused job and the failure that found the
// breaker open are dead-lettered; the refusal still pauses the worker.
func TestOutcomeBreakerDeadLetters(t *testing.T) {
	p := mustParse(t, breaker("dead_letter"))
	wantOutcome(t, p, failed(t0, 503), retry100)
	wantOutcome(t, p, failed(t0+1, 503), policy.Outcome{Action: policy.OutcomeDeadLetter, Reason: policy.CircuitOpen, Count: policy.CountDeadLetter})
	wantOutcome(t, p, before(t0+2), policy.Outcome{Action: policy.OutcomeDeadLetter, Reason: policy.CircuitOpen,
		DelayMs: 9_999, Pause: true, Count: policy.CountRefused})
}

// A success resets the consecutive failures the breaker counts.
func TestOutcomeSuccessFeedsBreaker(t *testing.T) {
	p := mustParse(t, breaker("defer"))
	wantOutcome(t, p, failed(t0, 503), retry100)
	wantOutcome(t, p, succeeded(t0+1), ack)
	wantOutcome(t, p, failed(t0+2, 503), retry100) // would have opened it without the success
	wantOutcome(t, p, before(t0+3), run)
}

// When the failure made the breaker open but half-open lets a call through
// by the time Acquire is asked, the job waits OpenPollMs. Here a trial's
// failure reopens the breaker: Acquire refuses for the full open_for.
func TestOutcomeTrialFailureReopens(t *testing.T) {
	p := mustParse(t, breaker("defer"))
	wantOutcome(t, p, failed(t0, 503), retry100)
	wantOutcome(t, p, failed(t0+1, 503), policy.Outcome{Action: policy.OutcomeDefer, Reason: policy.CircuitOpen, DelayMs: 10_000, Pause: true, Count: policy.CountRetry})
	wantOutcome(t, p, before(t0+10_001), run)
	wantOutcome(t, p, failed(t0+10_005, 503), policy.Outcome{Action: policy.OutcomeDefer, Reason: policy.CircuitOpen, DelayMs: 10_000, Pause: true, Count: policy.CountRetry})
}

// A budget that runs out defers the job by its backoff, without pausing;
// with no backoff it waits OpenPollMs.
func TestOutcomeBudgetExhausted(t *testing.T) {
	for _, c := range []struct {
		backoff string
		delay   int64
	}{
		{`{"strategy": "constant", "base": "250ms"}`, 250},
		{`{"strategy": "none"}`, policy.OpenPollMs},
	} {
		p := mustParse(t, `{"max_attempts": 10, "backoff": `+c.backoff+`, "jitter": {"mode": "none"},
			"retry_budget": {"type": "token_bucket", "max_tokens": 4, "token_ratio": 0.1}}`)
		var got policy.Outcome
		for i := range int64(5) {
			o, err := p.Outcome(failed(t0+i, 503))
			if err != nil {
				t.Fatal(err)
			}
			if got = o; o.Action != policy.OutcomeRetry {
				break
			}
		}
		want := policy.Outcome{Action: policy.OutcomeDefer, Reason: policy.BudgetExhausted, DelayMs: c.delay, Count: policy.CountRetry}
		if got != want {
			t.Errorf("backoff %s: once the budget ran out: %+v, want %+v", c.backoff, got, want)
		}
	}
}

func TestOutcomeRetryAndDeadLetter(t *testing.T) {
	p := mustParse(t, `{"max_attempts": 2, "backoff": {"strategy": "constant", "base": "100ms"}, "jitter": {"mode": "none"}}`)
	wantOutcome(t, p, failed(t0, 503), retry100)
	wantOutcome(t, p, failed(t0, 404), policy.Outcome{Action: policy.OutcomeDeadLetter, Reason: policy.PermanentError, Class: policy.Permanent, Count: policy.CountDeadLetter})
	e := failed(t0, 503)
	e.Failure.Attempt = 2
	wantOutcome(t, p, e, policy.Outcome{Action: policy.OutcomeDeadLetter, Reason: policy.MaxAttemptsReached, Count: policy.CountDeadLetter})
	// A stateless policy acks and runs without a clock.
	wantOutcome(t, p, before(0), run)
	wantOutcome(t, p, succeeded(0), ack)
}

// An invalid failure dead-letters the job as malformed, with Decide's error.
func TestOutcomeInvalidFailure(t *testing.T) {
	p := mustParse(t, breaker("defer"))
	e := failed(t0, 503)
	e.Failure.Attempt = 0
	o, err := p.Outcome(e)
	want := policy.Outcome{Action: policy.OutcomeDeadLetter, Reason: policy.Malformed, Count: policy.CountDeadLetter, Invalid: true}
	var ie *policy.InputError
	if o != want || !errors.As(err, &ie) || ie.Field != "attempt" {
		t.Fatalf("Outcome(attempt 0) = %+v, %v; want %+v and an *InputError for attempt", o, err, want)
	}
	if err.Error() != "invalid failure: attempt: must be >= 1 (got 0)" {
		t.Errorf("error %q", err)
	}
}

func TestOutcomeCrashLoop(t *testing.T) {
	p := mustParse(t, `{}`)
	for _, c := range []struct {
		n, max int64
		want   policy.Outcome
	}{
		{0, 5, run}, {4, 5, run},
		{5, 5, policy.Outcome{Action: policy.OutcomeDeadLetter, Reason: policy.CrashLoop}},
		{9, 5, policy.Outcome{Action: policy.OutcomeDeadLetter, Reason: policy.CrashLoop}},
		{100, 0, run}, // no limit
	} {
		wantOutcome(t, p, policy.JobEvent{Event: policy.EventDelivered, Deliveries: c.n, MaxDeliveries: c.max}, c.want)
	}
}

// An invalid event is an error and changes no state.
func TestOutcomeInvalidEvent(t *testing.T) {
	p := mustParse(t, breaker("defer"))
	for _, c := range []struct {
		e   policy.JobEvent
		msg string
	}{
		{policy.JobEvent{Event: 4}, "invalid event: event: must be 0 (before) to 3 (delivered) (got 4)"},
		{policy.JobEvent{Event: policy.EventDelivered, Deliveries: -1, MaxDeliveries: 5}, "invalid event: deliveries: must be >= 0 (got -1)"},
		{policy.JobEvent{Event: policy.EventDelivered, MaxDeliveries: -1}, "invalid event: max_deliveries: must be >= 0 (got -1)"},
		{before(-1), "invalid event: now_ms: must be >= 0 (got -1)"},
		{succeeded(0), "invalid event: now_ms: must be set (Unix milliseconds) for a policy with a retry budget or a circuit breaker"},
		{before(0), "invalid event: now_ms: must be set (Unix milliseconds) for a policy with a retry budget or a circuit breaker"},
	} {
		o, err := p.Outcome(c.e)
		var ee *policy.EventError
		if !errors.As(err, &ee) || err.Error() != c.msg || o != (policy.Outcome{}) {
			t.Errorf("Outcome(%+v) = %+v, %v; want the error %q", c.e, o, err, c.msg)
		}
	}
	// One failure before and after: the second still does not open it.
	wantOutcome(t, p, failed(t0, 503), retry100)
}

func TestOutcomeNames(t *testing.T) {
	for r, name := range map[policy.Reason]string{policy.Success: "success", policy.Malformed: "malformed", policy.CrashLoop: "crash_loop",
		policy.ServerDeclined: "server_declined", policy.Reason(len(policy.Reasons())): fmt.Sprintf("reason(%d)", len(policy.Reasons())),
		19: "reason(19)"} {
		if r.String() != name {
			t.Errorf("Reason(%d) = %q, want %q", r, r, name)
		}
		var back policy.Reason
		if err := back.UnmarshalText([]byte(name)); (err == nil) != (name[0] != 'r' || name == "retry_after") || (err == nil && back != r) {
			t.Errorf("UnmarshalText(%q) = %d, %v", name, back, err)
		}
	}
	// Reasons lists the decision's reasons (codes 0 to 15), not an outcome's.
	for i, name := range policy.Reasons() {
		var r policy.Reason
		if err := r.UnmarshalText([]byte(name)); err != nil || int(r) != i || r >= 16 {
			t.Errorf("Reasons()[%d] = %q (%d, %v), want a decision reason of that code", i, name, r, err)
		}
	}
	if policy.OutcomeDeadLetter.String() != "dead_letter" || policy.CountRefused.String() != "refused" || policy.EventDelivered.String() != "delivered" {
		t.Error("outcome names")
	}
}
