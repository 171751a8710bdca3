package queue

import (
	"context"
	"time"
)

// OutcomeEvent is an outcome a worker applied: the broker has it (Redis:
// the script ran; RabbitMQ: the next message confirmed and the delivery
// acked). It is what an OutcomeHook gets, with the fields of Node's
// onOutcome and Python's on_outcome: queue, job, action, reason, class,
// delay, error.
type OutcomeEvent struct {
	// Queue is the queue's name.
	Queue string
	// Job is the job as it was delivered: its ID, Attempt, Type, Payload, ….
	Job Job
	// Action is Ack, Retry, Defer or DeadLetter.
	Action Action
	// Reason is the policy's reason: "success" for an ack, "transient",
	// "max_attempts_reached", "permanent_error", …; "crash_loop" and
	// "malformed" for a job dead-lettered without running.
	Reason string
	// Class is the failure's class as the policy decided it: "retryable",
	// "permanent", "uncertain"; "" for a success or a job that did not run
	// (a crash loop, a malformed one, one the breaker refused).
	Class string
	// Delay is how long a retried or deferred job waits; 0 otherwise.
	Delay time.Duration
	// Error is the handler's error ("" on success), or why a job that did
	// not run was dead-lettered.
	Error string
}

// OutcomeHook is told of each outcome a worker applied, for per-job
// alerting ("page on a dead letter of this job type"). It runs on the
// worker's goroutine that applies outcomes, before the next one: keep it
// short, or hand the event off. ctx is the worker's, not cancelled by its
// shutdown; a hook that panics is logged, and the worker goes on.
type OutcomeHook func(ctx context.Context, e OutcomeEvent)

// WithOutcomeHook has the worker call h with every outcome it applies
// (Node's onOutcome, Python's on_outcome): successes, retries, deferrals
// and dead letters, malformed jobs among them, and on RabbitMQ the crash
// loops the worker dead-letters. Not told: an early RabbitMQ message
// delayed again, a plain one adopted, an outcome the broker did not take
// (Redis: the entry was settled elsewhere), and the crash loops Redis'
// reclaim loop dead-letters in bulk (counted in
// backstop_dead_letters_total{reason="crash_loop"}).
//
//	q.Work(ctx, p, h, redisqueue.WithOutcomeHook(func(ctx context.Context, e queue.OutcomeEvent) {
//		if e.Action == queue.DeadLetter && e.Job.Type == "charge_card" {
//			pager.Page(ctx, e.Queue+": "+e.Job.ID+" dead-lettered: "+e.Reason)
//		}
//	}))
func WithOutcomeHook(h OutcomeHook) Option { return func(r *Runner) { r.hook = h } }

// Applied tells the Runner's outcome hook (WithOutcomeHook) that the broker
// took outcome o of job j. Each broker's worker calls it once per applied
// outcome.
func (r *Runner) Applied(ctx context.Context, j Job, o Outcome) {
	if r.hook == nil {
		return
	}
	defer func() {
		if p := recover(); p != nil {
			r.log.Error("queue outcome hook panicked", "queue", r.name, "job", j.ID, "panic", p)
		}
	}()
	r.hook(context.WithoutCancel(ctx), OutcomeEvent{Queue: r.name, Job: j, Action: o.Action, Reason: o.Reason,
		Class: o.Class, Delay: o.Delay, Error: o.LastError})
}
