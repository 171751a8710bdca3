package queue

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/internal/clientmetrics"
)

// Outcome is what a worker does with a job after it ran, or after the
// breaker refused it: the broker-neutral verdict that the Redis worker
// applies through its scripts and another broker's worker (queue/rabbitmq)
// through its own moves.
type Outcome struct {
	// Action is "ack", "retry", "defer" (not the job's fault: its attempt
	// is not spent) or "dead_letter".
	Action string
	// Reason is the policy's reason ("success" for an ack, "circuit_open",
	// "budget_exhausted" for a deferral, "max_attempts_reached", …).
	Reason string
	// Delay is how long a retried or deferred job waits.
	Delay time.Duration
	// LastError is the handler's error ("" on success).
	LastError string
}

// Runner runs jobs with a policy and decides their outcomes exactly as
// Work does: before the job it asks the breaker (Acquire, or
// CircuitState), then runs the handler, feeds a success to the policy's
// budget and breaker, decides a failure (classified by backstop.ClassifyError), and
// records the client metrics (WithMetrics). It is the part of Work a
// worker on another broker reuses; it does not touch Redis.
type Runner struct {
	w *worker
	p backstop.Decider
}

// NewRunner returns a Runner for the jobs of queue name decided by p. It
// honours WithMetrics, WithPolicies, WithLogger and WithHandlerTimeout
// (default: no deadline); other options are ignored.
//
// # Errors
//
// As Work: an invalid WithMetrics policy name or registry, an invalid
// WithPolicies map, WithHandlerTimeout <= 0.
func NewRunner(name string, p backstop.Decider, opts ...WorkerOption) (*Runner, error) {
	w := &worker{openPoll: time.Second, log: slog.Default(), rand: rand.Float64}
	for _, o := range opts {
		o(w)
	}
	if err := w.bind(name, 0); err != nil {
		return nil, err
	}
	return &Runner{w: w, p: p}, nil
}

// bind checks the handler timeout (timeout when WithHandlerTimeout is not
// given) and prepares the worker's metrics (WithMetrics) and per-type
// policies (WithPolicies) for queue name.
func (w *worker) bind(name string, timeout time.Duration) error {
	if !w.timeoutSet {
		w.timeout = timeout
	} else if w.timeout <= 0 {
		return fmt.Errorf("queue %s: WithHandlerTimeout: must be positive, got %v", name, w.timeout)
	}
	w.name = name
	if w.metricsReg != nil || w.metricsPolicy != "" {
		m, err := clientmetrics.Bind(w.metricsReg, w.metricsPolicy, name, "queue: WithMetrics")
		if err != nil {
			return err
		}
		w.metrics = m
	}
	return w.bindPolicies(name)
}

// Run runs h on j (a job that is not Malformed: the caller dead-letters
// those) and returns its outcome. A job whose type has its own policy
// (WithPolicies) runs with it. Deciding does not see ctx's cancellation: a
// job that finished during shutdown still gets its outcome.
func (r *Runner) Run(ctx context.Context, h Handler, j Job) Outcome {
	rw, rp := r.w.policyFor(j.Type, r.p)
	o := rw.run(ctx, rp, h, j)
	return Outcome{Action: o.action, Reason: o.reason, Delay: o.delay, LastError: o.lastErr}
}

// PausedUntil is when the breaker of Run's policy (not a type's) may let a
// job through again, after it refused one or a failure found it open: a
// worker should take no new job before then. Zero when never paused.
func (r *Runner) PausedUntil() time.Time {
	ms := r.w.pausedUntil.Load()
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}
