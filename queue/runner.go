package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/internal/clientmetrics"
	"github.com/backstop-dev/backstop/policy"
)

// Action is what a worker does with a job.
type Action string

const (
	// Ack: the job succeeded.
	Ack Action = "ack"
	// Retry: the job failed and waits Outcome.Delay before its next attempt.
	Retry Action = "retry"
	// Defer: the breaker or the budget refused the job; it waits
	// Outcome.Delay without spending an attempt (not the job's fault).
	Defer Action = "defer"
	// DeadLetter: the job goes to the dead letter queue.
	DeadLetter Action = "dead_letter"
)

// Outcome is what a worker does with a job after it ran, or after the
// breaker refused it: the broker-neutral verdict that each broker's worker
// applies through its own atomic moves. A worker keeps it, decided once,
// until the broker takes it.
type Outcome struct {
	Action Action
	// Reason is the policy's reason ("success" for an ack, "circuit_open",
	// "budget_exhausted" for a deferral, "max_attempts_reached", …).
	Reason string
	// Delay is how long a retried or deferred job waits.
	Delay time.Duration
	// LastError is the handler's error ("" on success).
	LastError string
	// Class is the failure's class the policy decided ("retryable",
	// "permanent", "uncertain"); "" when the job succeeded or did not run.
	Class string
}

// Option configures a Runner. Each broker's worker takes these as its own
// options (WithHandlerTimeout, WithLogger, WithMetrics, WithPolicies,
// WithOutcomeHook) and passes them on.
type Option func(*Runner)

// WithHandlerTimeout bounds each run of the handler (NewRunner's default:
// none; each broker's worker sets its own). The handler's ctx carries the
// deadline; at the deadline the attempt fails with a deadline error that
// backstop.ClassifyError classifies as error kind timeout, and the policy
// decides it as any failure. A handler that ignores its ctx is left
// running, logged once: the worker does not wait for it. NewRunner refuses
// d <= 0.
func WithHandlerTimeout(d time.Duration) Option {
	return func(r *Runner) { r.timeout, r.timeoutSet = d, true }
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(r *Runner) { r.log = l } }

// WithMetrics counts the runner's attempts, retries, refused jobs, retry
// delays and breaker state in reg, under the backstop_client_* families
// every language exports (as retry.WithMetrics does), labelled
// policy=policyName and target=the queue's name. NewRunner returns an error
// for an empty or invalid UTF-8 policy name, or a registry holding other
// collectors under those names; a registry that already holds the families
// is reused.
//
// A job the breaker refuses before it runs counts as refused
// (calls_refused_total, circuit_open); a failed job deferred because the
// breaker opened or the budget ran out counts as a retry with that reason.
func WithMetrics(reg prometheus.Registerer, policyName string) Option {
	return func(r *Runner) { r.metricsReg, r.metricsPolicy = reg, policyName }
}

// WithEnqueueClock sets the clock a job's first_enqueued_ms was stamped
// with (default time.Now): the Runner measures the job's elapsed time (the
// policy's max_elapsed) on it. A broker whose scripts stamp the time with
// the server's clock (Redis TIME) passes its estimate of that clock, so that
// a worker whose own clock is off neither dead-letters a job early nor
// retries one past its time budget. The policy's breaker, budget and
// Retry-After dates stay on the worker's own clock.
func WithEnqueueClock(now func() time.Time) Option { return func(r *Runner) { r.enqueueNow = now } }

// WithRandom sets the random input of each decision, in [0, 1) (default
// math/rand/v2's Float64): the shared cases pin it, as the vectors do.
func WithRandom(f func() float64) Option { return func(r *Runner) { r.rand = f } }

// Runner runs jobs with a policy, the same on every broker: it asks the
// policy's Outcome before the job (the breaker's gate), runs the handler
// within its deadline, asks the Outcome of its success or its failure
// (classified by backstop.ClassifyError), pauses when the policy says so,
// and records the client metrics the outcome names (WithMetrics). The
// policy decides every outcome; the Runner touches no broker.
type Runner struct {
	p             backstop.Decider
	name          string        // the queue's, for the logs and the metrics
	timeout       time.Duration // WithHandlerTimeout (0: none)
	timeoutSet    bool
	pausedUntil   atomic.Int64 // unix ms: the breaker refused a job; take none before
	log           *slog.Logger
	rand          func() float64
	enqueueNow    func() time.Time // WithEnqueueClock: the clock of first_enqueued_ms
	metricsReg    prometheus.Registerer
	metricsPolicy string
	metrics       *clientmetrics.Recorder // nil: no metrics
	policies      map[string]backstop.Decider
	typed         map[string]*Runner // by job type: WithPolicies
	hook          OutcomeHook        // WithOutcomeHook (nil: none)
}

// NewRunner returns a Runner for the jobs of queue name decided by p.
//
// # Errors
//
// An invalid WithMetrics policy name or registry, an invalid WithPolicies
// map, WithHandlerTimeout <= 0.
func NewRunner(name string, p backstop.Decider, opts ...Option) (*Runner, error) {
	r := &Runner{p: p, name: name, log: slog.Default(), rand: rand.Float64, enqueueNow: time.Now}
	for _, o := range opts {
		o(r)
	}
	if r.timeoutSet && r.timeout <= 0 {
		return nil, fmt.Errorf("queue %s: WithHandlerTimeout: must be positive, got %v", name, r.timeout)
	}
	if r.metricsReg != nil || r.metricsPolicy != "" {
		m, err := clientmetrics.Bind(r.metricsReg, r.metricsPolicy, name, "queue: WithMetrics")
		if err != nil {
			return nil, err
		}
		r.metrics = m
	}
	if err := r.bindPolicies(); err != nil {
		return nil, err
	}
	return r, nil
}

// Run runs h on j (a job that is not Malformed: the caller dead-letters
// those) and returns its outcome. A job whose type has its own policy
// (WithPolicies) runs with it. Deciding does not see ctx's cancellation: a
// job that finished during shutdown still gets its outcome.
func (r *Runner) Run(ctx context.Context, h Handler, j Job) Outcome {
	return r.forType(j.Type).run(ctx, h, j)
}

// PausedUntil is when the breaker of Run's policy (not a type's) may let a
// job through again, after it refused one or a failure found it open: a
// worker should take no new job before then. Zero when never paused.
func (r *Runner) PausedUntil() time.Time {
	ms := r.pausedUntil.Load()
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// run asks the breaker, runs h on j and asks the outcome: the worker's path
// from a delivery to an outcome, which the shared queue cases
// (testdata/queue, testdata/rabbitmq) drive in every language. Asking must
// not see shutdown: a cancelled context would fail a wasm policy's call,
// and a job that finished during shutdown still gets its outcome.
func (r *Runner) run(ctx context.Context, h Handler, j Job) Outcome {
	dctx := context.WithoutCancel(ctx)
	// A policy that cannot answer lets the job run: its outcome after the
	// run still applies.
	gate, err := r.p.Outcome(dctx, policy.JobEvent{Event: policy.EventBefore, Failure: policy.Failure{NowMs: time.Now().UnixMilli()}})
	if err == nil && gate.Action != policy.OutcomeRun {
		// The breaker protects the dependency before the call: the handler
		// does not run.
		o := r.apply(dctx, gate)
		if o.Action == DeadLetter {
			o.LastError = "circuit breaker open: the job was not run"
		}
		return o
	}
	r.measure(j)
	started := time.Now()
	herr := r.call(ctx, h, j)
	if r.p.Stateful() {
		// The run's duration (monotonic) for the breaker's slow-call rate,
		// success or failure. A policy that cannot take it still decides
		// the outcome below.
		end := time.Now()
		_ = r.p.RecordDuration(dctx, end.UnixMilli(), max(end.Sub(started).Milliseconds(), 0))
	}
	if herr == nil {
		po, err := r.p.Outcome(dctx, policy.JobEvent{Event: policy.EventSuccess, Failure: policy.Failure{NowMs: time.Now().UnixMilli()}})
		if err != nil { // the job succeeded all the same
			po = policy.Outcome{Action: policy.OutcomeAck, Reason: policy.Success, Count: policy.CountSuccess}
		}
		return r.apply(dctx, po)
	}
	f := policy.Failure{
		Attempt: j.Attempt, IdempotencyKey: j.ID, NowMs: time.Now().UnixMilli(), PrevDelayMs: max(0, j.PrevDelayMs),
		ElapsedMs: max(0, r.enqueueNow().UnixMilli()-j.FirstEnqueuedMs), Random: r.rand(),
	}
	backstop.ClassifyError(herr, &f)
	po, err := r.p.Outcome(dctx, policy.JobEvent{Event: policy.EventFailure, Failure: f})
	if err != nil {
		// Invalid input (po says so), or a policy that cannot answer.
		po = policy.Outcome{Action: policy.OutcomeDeadLetter, Reason: policy.Malformed, Count: policy.CountDeadLetter}
		o := r.apply(dctx, po)
		o.LastError = fmt.Sprintf("%v (policy refused the failure: %v)", herr, err)
		return o
	}
	o := r.apply(dctx, po)
	o.LastError = herr.Error()
	o.Class = po.Class.String()
	return o
}

// measure records the latency of retried job j as it starts: now on the
// broker's clock minus the failure's time, which is its due time minus the
// delay decided then. A job deferred since its last failure (the breaker,
// the budget) is not measured: its due time is the deferral's, not the
// retry's, and its wait is not a decided delay.
func (r *Runner) measure(j Job) {
	if r.metrics == nil || j.Attempt < 2 || j.DueMs <= 0 || j.PrevDelayMs < 0 || j.PrevDelayMs > j.DueMs ||
		j.LastReason == policy.CircuitOpen.String() || j.LastReason == policy.BudgetExhausted.String() {
		return
	}
	failed := j.DueMs - j.PrevDelayMs
	r.metrics.Latency(time.Duration(r.enqueueNow().UnixMilli()-failed) * time.Millisecond)
}

// Delivered is the outcome of job j, which a broker delivered deliveries
// times without an outcome (a worker crashed or was cut off mid-job), when
// that reaches maxDeliveries: a crash loop, dead-lettered. ok is false
// when the job may run.
func (r *Runner) Delivered(ctx context.Context, j Job, deliveries, maxDeliveries int64) (o Outcome, ok bool) {
	po, err := r.forType(j.Type).p.Outcome(context.WithoutCancel(ctx),
		policy.JobEvent{Event: policy.EventDelivered, Deliveries: deliveries, MaxDeliveries: maxDeliveries})
	if err != nil || po.Action == policy.OutcomeRun {
		return Outcome{}, false
	}
	return r.apply(ctx, po), true
}

// call runs h on j within the handler timeout (none when 0). The handler's
// ctx carries the deadline; a handler that fails once the deadline passed,
// or has not returned by then, fails the attempt with a deadlineError. One
// that ignores its ctx is left running, logged: the worker goes on.
func (r *Runner) call(ctx context.Context, h Handler, j Job) error {
	if r.timeout <= 0 {
		return h(ctx, j)
	}
	dl := &deadlineError{r.timeout}
	hctx, cancel := context.WithTimeoutCause(ctx, r.timeout, dl)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- h(hctx, j) }()
	timer := time.NewTimer(r.timeout)
	defer timer.Stop()
	returned := func(err error) error {
		if err != nil && errors.Is(context.Cause(hctx), dl) {
			return dl
		}
		return err
	}
	select {
	case err := <-done:
		return returned(err)
	case <-timer.C:
	}
	// The ctx ended with the timer: a handler that honours it is returning.
	select {
	case err := <-done:
		return returned(err)
	case <-time.After(min(r.timeout/10, 100*time.Millisecond)):
		r.log.Warn("queue handler still running at its deadline; not waited for", "queue", r.name, "job", j.ID, "entry", j.EntryID, "timeout", r.timeout)
		return dl
	}
}

// deadlineError fails a job whose handler ran past the handler timeout:
// a deadline (context.DeadlineExceeded), so error kind timeout.
type deadlineError struct{ timeout time.Duration }

func (e *deadlineError) Error() string {
	return "handler deadline exceeded after " + e.timeout.String()
}
func (e *deadlineError) Unwrap() error { return context.DeadlineExceeded }

// apply pauses the worker and counts po in the metrics as the policy
// says, and returns it as the worker's Outcome.
func (r *Runner) apply(ctx context.Context, po policy.Outcome) Outcome {
	delay := time.Duration(po.DelayMs) * time.Millisecond
	if po.Pause {
		r.pause(delay)
	}
	o := Outcome{Action: Action(po.Action.String()), Reason: po.Reason.String()}
	if o.Action == Retry || o.Action == Defer {
		o.Delay = delay
	}
	if r.metrics == nil || po.Count == policy.CountNone {
		return o
	}
	switch po.Count {
	case policy.CountSuccess:
		r.metrics.Attempt(clientmetrics.OutcomeSuccess)
	case policy.CountRetry:
		r.metrics.Attempt(clientmetrics.OutcomeRetry)
		r.metrics.Retry(o.Reason, o.Delay)
	case policy.CountDeadLetter:
		r.metrics.Attempt(clientmetrics.OutcomeDeadLetter)
	case policy.CountRefused:
		r.metrics.Refused(o.Reason)
	}
	if s, err := r.p.CircuitState(ctx, time.Now().UnixMilli()); err == nil {
		r.metrics.State(s)
	}
	if milli, ok, err := r.p.BudgetTokens(ctx, time.Now().UnixMilli()); err == nil && ok {
		r.metrics.Budget(milli)
	}
	return o
}

// pause holds new jobs back for d from now (a later pause wins).
func (r *Runner) pause(d time.Duration) {
	until := time.Now().Add(d).UnixMilli()
	for {
		cur := r.pausedUntil.Load()
		if cur >= until || r.pausedUntil.CompareAndSwap(cur, until) {
			return
		}
	}
}
