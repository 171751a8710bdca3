// Package backstop names what the retry loop (package retry) and the queue
// workers (packages queue and queue/rabbitmq) need of a retry policy, once:
// a Decider, which a *host.Policy (a policy running in backstop.wasm) is
// and Native makes of a native *policy.Policy; and the Failure a handler or
// an operation returns to say how it failed.
//
//	p, _ := policy.Parse(data)
//	resp, err := retry.Do(ctx, backstop.Native(p), op)
package backstop

import (
	"context"

	"github.com/backstop-dev/backstop/internal/errkind"
	"github.com/backstop-dev/backstop/policy"
)

// Decider is a retry policy as a caller of it sees it: *host.Policy, or
// Native over a *policy.Policy. Every method takes the time of the
// question, so a policy holds no clock.
type Decider interface {
	// Decide says what to do after a failure.
	Decide(ctx context.Context, f policy.Failure) (policy.Decision, error)
	// Acquire asks the breaker's permission for one call at nowMs: while
	// it is open no call runs, half-open admits only its trials.
	Acquire(ctx context.Context, nowMs int64) (policy.Permit, error)
	// RecordSuccess feeds the retry budget and the breaker a success.
	RecordSuccess(ctx context.Context, nowMs int64) error
	// RecordDuration tells the breaker how long a call that ended at
	// nowMs took (durationMs, success or failure), for its slow-call rate;
	// reported before the call's RecordSuccess or Decide.
	RecordDuration(ctx context.Context, nowMs, durationMs int64) error
	// CircuitState is the breaker's state at nowMs (closed without one).
	CircuitState(ctx context.Context, nowMs int64) (policy.CircuitState, error)
	// BudgetTokens is what is left of the retry budget, in thousandths of
	// a token; ok is false for a policy without a budget.
	BudgetTokens(ctx context.Context, nowMs int64) (milli int64, ok bool, err error)
	// AttemptTimeout is how long the attempt starting elapsedMs after the
	// first may run (attempt_timeout, cut to what is left of max_elapsed);
	// 0 is no bound.
	AttemptTimeout(ctx context.Context, elapsedMs int64) (int64, error)
	// ConnectTimeoutMs is the policy's connect_timeout: how long
	// establishing a connection may take within an attempt (0: the
	// client's own); retry.HTTPTransport and retry.Dialer apply it.
	ConnectTimeoutMs() int64
	// OnOpen is what a queue does with a job the breaker or the budget
	// refused: "defer" (the default) or "dead_letter".
	OnOpen() string
	// Stateful reports a breaker or a budget: state that successes feed.
	Stateful() bool
	// Outcome says what a queue worker does about a job event: before it
	// runs (the breaker's gate), after it succeeded or failed, or when a
	// broker delivered it too often (policy.Policy.Outcome). An invalid
	// failure gives the Outcome that dead-letters it with the error.
	Outcome(ctx context.Context, e policy.JobEvent) (policy.Outcome, error)
}

// Native adapts a native *policy.Policy to Decider.
func Native(p *policy.Policy) Decider { return native{p} }

type native struct{ p *policy.Policy }

func (n native) Decide(_ context.Context, f policy.Failure) (policy.Decision, error) {
	return n.p.Decide(f)
}

func (n native) Acquire(_ context.Context, nowMs int64) (policy.Permit, error) {
	return n.p.Acquire(nowMs), nil
}

func (n native) RecordSuccess(_ context.Context, nowMs int64) error {
	n.p.RecordSuccess(nowMs)
	return nil
}

func (n native) RecordDuration(_ context.Context, nowMs, durationMs int64) error {
	return n.p.RecordDuration(nowMs, durationMs)
}

func (n native) CircuitState(_ context.Context, nowMs int64) (policy.CircuitState, error) {
	return n.p.CircuitState(nowMs), nil
}

func (n native) BudgetTokens(_ context.Context, nowMs int64) (int64, bool, error) {
	milli, ok := n.p.BudgetTokens(nowMs)
	return milli, ok, nil
}

func (n native) AttemptTimeout(_ context.Context, elapsedMs int64) (int64, error) {
	return n.p.AttemptTimeout(elapsedMs)
}

func (n native) ConnectTimeoutMs() int64 { return n.p.ConnectTimeoutMs() }

func (n native) OnOpen() string { return n.p.OnOpen() }

func (n native) Stateful() bool { return n.p.Stateful() }

func (n native) Outcome(_ context.Context, e policy.JobEvent) (policy.Outcome, error) {
	return n.p.Outcome(e)
}

// Failure is the one failure type (policy.Failure, generated from
// contract/abi.json with every field's doc): the policy decides on it, and
// a *Failure is the error a queue Handler or a retry Operation returns to
// say how it failed, "the downstream answered 503 with Retry-After: 7":
//
//	return &backstop.Failure{HTTPStatus: 503, RetryAfter: "7", Err: err}
//
// What it says about the failure (the fields marked error in the schema:
// status, code, kind, hints, signals) is what ClassifyError copies; errors
// without one are classified by the table.
type Failure = policy.Failure

// ClassifyError fills the classification fields of a policy failure from an
// error: a *Failure anywhere in its chain, else by the table every language
// follows (contract/errorkinds.json, in its "go" order): a dial that timed
// out (connect_timeout: the request never left), a deadline, an errno
// (refused, reset, timed out), a DNS failure, a network timeout. Other
// errors leave the fields empty, and the policy's default class applies.
func ClassifyError(err error, f *policy.Failure) { errkind.Classify(err, f) }
