package policy_test

import (
	"errors"
	"fmt"

	"github.com/backstop-dev/backstop/policy"
)

// t1 is a fixed "now" for the examples (2026-01-01T00:00:00Z): time is an
// input of every decision.
const t1 = 1_767_225_600_000

// A policy file becomes a *Policy once; each failure becomes a decision.
func ExampleParse() {
	p, err := policy.Parse([]byte(`
max_attempts: 3
backoff: {strategy: exponential, base: 200ms, cap: 5s}
jitter: {mode: none}
`))
	if err != nil {
		panic(err)
	}
	for _, f := range []policy.Failure{
		{Attempt: 1, HTTPStatus: 503},
		{Attempt: 2, HTTPStatus: 503},
		{Attempt: 1, HTTPStatus: 429, RetryAfter: "2"},
		{Attempt: 3, HTTPStatus: 503},
		{Attempt: 1, HTTPStatus: 404},
	} {
		d, err := p.Decide(f)
		if err != nil {
			panic(err)
		}
		fmt.Println(f.HTTPStatus, f.Attempt, d.Action, d.Reason, d.Delay())
	}
	// Output:
	// 503 1 retry transient 200ms
	// 503 2 retry transient 400ms
	// 429 1 retry retry_after 2s
	// 503 3 dead_letter max_attempts_reached 0s
	// 404 1 dead_letter permanent_error 0s
}

// An invalid policy file names each invalid field.
func ExampleParse_invalid() {
	_, err := policy.Parse([]byte(`{"max_attempts": -1, "backoff": {"base": "1s", "cap": "100ms"}}`))
	var pe *policy.Error
	if errors.As(err, &pe) {
		for _, problem := range pe.Problems {
			fmt.Println(problem.Field)
		}
	}
	// Output:
	// max_attempts
	// backoff.cap
}

// A queue worker asks the outcome of each event of a job: the breaker's
// gate before it runs, then its failure or its success. Here the breaker
// opens after two failures: the job that opens it is deferred (no attempt
// spent) until the breaker may half-open, and the worker pauses.
func ExamplePolicy_Outcome() {
	p, err := policy.Parse([]byte(`{"backoff": {"strategy": "constant", "base": "1s"}, "jitter": {"mode": "none"},
		"circuit_breaker": {"failure_threshold": 2, "open_for": "30s"}}`))
	if err != nil {
		panic(err)
	}
	show := func(what string, e policy.JobEvent) {
		o, err := p.Outcome(e)
		if err != nil {
			panic(err)
		}
		if o.Action == policy.OutcomeRun { // a run has no reason
			fmt.Println(what+":", o.Action)
			return
		}
		fmt.Println(what+":", o.Action, o.Reason, o.DelayMs, "pause", o.Pause, "count", o.Count)
	}
	failed := func(now int64) policy.JobEvent {
		return policy.JobEvent{Event: policy.EventFailure, Failure: policy.Failure{Attempt: 1, HTTPStatus: 503, IdempotencyKey: "job-1", NowMs: now}}
	}
	show("failed", failed(t1))
	show("failed", failed(t1+1000))
	show("next job", policy.JobEvent{Event: policy.EventBefore, Failure: policy.Failure{NowMs: t1 + 2000}})
	show("half-open", policy.JobEvent{Event: policy.EventBefore, Failure: policy.Failure{NowMs: t1 + 31_000}})
	show("succeeded", policy.JobEvent{Event: policy.EventSuccess, Failure: policy.Failure{NowMs: t1 + 31_500}})
	show("redelivered", policy.JobEvent{Event: policy.EventDelivered, Deliveries: 5, MaxDeliveries: 5})
	// Output:
	// failed: retry transient 1000 pause false count retry
	// failed: defer circuit_open 30000 pause true count retry
	// next job: defer circuit_open 29000 pause true count refused
	// half-open: run
	// succeeded: ack success 0 pause false count success
	// redelivered: dead_letter crash_loop 0 pause false count none
}

// A caller asks the breaker before each call: while it is open no call
// leaves, half-open admits a bounded number of trials (one here) until they
// report back or open_for passes.
func ExamplePolicy_Acquire() {
	p, err := policy.Parse([]byte(`{"circuit_breaker": {"failure_threshold": 1, "open_for": "10s"}}`))
	if err != nil {
		panic(err)
	}
	if _, err := p.Decide(policy.Failure{Attempt: 1, HTTPStatus: 503, NowMs: t1}); err != nil {
		panic(err)
	}
	for _, now := range []int64{t1 + 1, t1 + 10_000, t1 + 10_001} {
		pm := p.Acquire(now)
		fmt.Println(pm.Allowed, pm.State, pm.RetryInMs)
	}
	// Output:
	// false open 9999
	// true half_open 0
	// false half_open 9999
}

// Presets are named policies for common workloads.
func ExamplePreset() {
	p, err := policy.Preset("critical")
	if err != nil {
		panic(err)
	}
	fmt.Println(p.Name(), p.MaxAttempts())
	fmt.Println(policy.PresetNames())
	// Output:
	// critical 3
	// [batch cloud-tasks critical default fast-transient]
}

// Lints warn of a valid policy's anti-patterns; lint_ignore silences one
// with the policy's reason.
func ExamplePolicy_Lints() {
	p, err := policy.Parse([]byte(`
max_attempts: 20
jitter: {mode: none}
attempt_timeout: 5s
lint_ignore: {BP003: "the nightly export may wait out an hour of maintenance"}
`))
	if err != nil {
		panic(err)
	}
	for _, l := range p.Lints() {
		fmt.Println(l.Code, l.Field)
	}
	// Output:
	// BP002 jitter.mode
	// BP004 attempt_timeout
}

// A failure_rate breaker opens on the share of failures in its window: 8
// failures in the last 10 calls, where one success every five calls keeps
// a consecutive-failures breaker closed.
func ExampleParse_failureRateBreaker() {
	p, err := policy.Parse([]byte(`
circuit_breaker:
  type: failure_rate
  failure_rate_threshold: 50
  sliding_window: {type: count, size: 20}
  minimum_calls: 10
  open_for: 30s
`))
	if err != nil {
		panic(err)
	}
	for i := int64(0); i < 10; i++ {
		if i%5 == 4 {
			p.RecordSuccess(t1 + i)
		} else {
			p.Decide(policy.Failure{Attempt: 1, HTTPStatus: 503, NowMs: t1 + i})
		}
	}
	fmt.Println(p.CircuitState(t1 + 10))
	// Output: open
}
