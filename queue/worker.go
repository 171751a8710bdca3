package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/internal/clientmetrics"
	"github.com/backstop-dev/backstop/internal/ctxtime"
	"github.com/backstop-dev/backstop/policy"
)

// Handler processes one job. A nil error acks it; an error is classified
// (see backstop.Failure and backstop.ClassifyError) and decided by the policy.
type Handler func(ctx context.Context, job Job) error

// WorkerOption configures Work.
type WorkerOption func(*worker)

type worker struct {
	consumer      string
	batch         int64
	block         time.Duration
	promoteEvery  time.Duration
	promoteLimit  int
	reclaimEvery  time.Duration
	minIdle       time.Duration
	maxDeliveries int
	timeout       time.Duration // WithHandlerTimeout (0: none, NewRunner's default)
	timeoutSet    bool
	name          string        // the queue's, for the logs
	outcomeWait   time.Duration // per attempt at applying an outcome
	applyBase     time.Duration // first pause after Redis refused an outcome
	applyCap      time.Duration // longest pause (also capped at minIdle/4)
	refused       atomic.Int64  // outcomes Redis refused, every attempt counted
	pausedUntil   atomic.Int64  // unix ms: no read before, the breaker refused a job
	openPoll      time.Duration // a refused job's wait when the policy cannot say how long
	log           *slog.Logger
	rand          func() float64
	metricsReg    prometheus.Registerer       // WithMetrics
	metricsPolicy string                      //
	metrics       *clientmetrics.Recorder     // nil: no metrics
	policies      map[string]backstop.Decider // WithPolicies: by job type
	typed         map[string]typedPolicy      // bindPolicies
}

// WithConsumer names this worker in the consumer group (default:
// hostname-pid).
func WithConsumer(name string) WorkerOption { return func(w *worker) { w.consumer = name } }

// WithBatch sets how many entries one read takes (default 16) and how long
// it blocks waiting for them (default 1s).
func WithBatch(n int, block time.Duration) WorkerOption {
	return func(w *worker) { w.batch, w.block = int64(n), block }
}

// WithPromote sets the interval of the promote loop (default 1s, jittered
// ±20%; 0 disables it) and its batch limit (default 500).
func WithPromote(every time.Duration, limit int) WorkerOption {
	return func(w *worker) { w.promoteEvery, w.promoteLimit = every, limit }
}

// WithReclaim sets the interval of the reclaim loop (default 30s, jittered;
// 0 disables it), the idle time after which a pending entry is taken over
// (default 1m) and the delivery count that makes it a crash loop (default 5).
func WithReclaim(every, minIdle time.Duration, maxDeliveries int) WorkerOption {
	return func(w *worker) { w.reclaimEvery, w.minIdle, w.maxDeliveries = every, minIdle, maxDeliveries }
}

// WithHandlerTimeout bounds each run of the handler (default 5 times the
// min idle time of WithReclaim: 5m). The handler's ctx carries the
// deadline; at the deadline the attempt fails with a deadline error that
// backstop.ClassifyError classifies as error kind timeout, and the policy decides it
// as any failure (README, "Deadlines"). Work refuses d <= 0.
//
// # Notes
//
// A handler that ignores its ctx is left running, logged once: the worker
// does not wait for it, and applies the outcome. While a handler runs, the
// worker holds its job and the jobs read with it (see Hold) every third of
// the min idle time, so reclaim does not hand them to another consumer
// before the deadline.
func WithHandlerTimeout(d time.Duration) WorkerOption {
	return func(w *worker) { w.timeout, w.timeoutSet = d, true }
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) WorkerOption { return func(w *worker) { w.log = l } }

// WithMetrics counts the worker's attempts, retries, refused jobs, retry
// delays and breaker state in reg, under the backstop_client_* families
// every language exports (as retry.WithMetrics does), labelled
// policy=policyName and target=the queue's name. Work returns an error at
// once for an empty or invalid UTF-8 policy name, or a registry holding
// other collectors under those names; a registry that already holds the
// families is reused.
//
// A job the breaker refuses before it runs counts as refused
// (calls_refused_total, circuit_open); a failed job deferred because the
// breaker opened or the budget ran out counts as a retry with that reason.
func WithMetrics(reg prometheus.Registerer, policyName string) WorkerOption {
	return func(w *worker) { w.metricsReg, w.metricsPolicy = reg, policyName }
}

// Work consumes the queue until ctx is done: it reads jobs with the
// consumer group, runs h within its deadline (WithHandlerTimeout), and
// applies the policy's decision through the scripts; alongside, it runs the
// promote loop and the reclaim loop. On shutdown it stops reading, lets the
// running handler finish (at most until its deadline), and applies its
// outcome before returning, so no outcome is lost.
//
// # Notes
//
// When Redis refuses to apply an outcome for a while (out of memory with
// noeviction, a read-only replica during a failover, a server loading or
// busy, a lost connection), the worker keeps the outcome, decided once,
// and sends it again with jittered backoff (20ms doubling to at most 2s and
// a quarter of the min idle time) until Redis takes it or the entry is no
// longer pending. Meanwhile it holds the job and the jobs read with it (see
// Hold), so reclaim does not run them a second time elsewhere; it reads
// nothing new. Stopped meanwhile, it makes one last attempt and logs "queue
// outcome not applied": the entry stays pending, for reclaim. A request
// Redis rejects as such (bad arguments, a key of the wrong type) is logged
// and not sent again. The log says when an outcome is first refused, and
// after how many refusals it was applied.
//
// Before each job the worker asks the policy's breaker (Acquire, when the
// backstop.Decider has it; else its CircuitState): refused, the handler is not
// called, the job is deferred (Defer) until the breaker may half-open, and
// the worker reads nothing until then; the wait ends at once when ctx is
// done. In half-open only the admitted trials run. A failure the policy
// answers with circuit_open or budget_exhausted is deferred too, without
// spending an attempt. A policy with on_open: dead_letter dead-letters such
// jobs instead (the behaviour before deferral).
func (q *Queue) Work(ctx context.Context, p backstop.Decider, h Handler, opts ...WorkerOption) error {
	host, _ := os.Hostname()
	w := &worker{
		consumer: fmt.Sprintf("%s-%d", host, os.Getpid()), batch: 16, block: time.Second,
		promoteEvery: time.Second, promoteLimit: 500,
		reclaimEvery: 30 * time.Second, minIdle: time.Minute, maxDeliveries: 5,
		outcomeWait: 10 * time.Second, applyBase: 20 * time.Millisecond, applyCap: 2 * time.Second,
		openPoll: time.Second, log: slog.Default(), rand: rand.Float64,
	}
	for _, o := range opts {
		o(w)
	}
	timeout := 5 * time.Minute
	if w.minIdle > 0 {
		timeout = 5 * w.minIdle
	}
	if err := w.bind(q.name, timeout); err != nil {
		return err
	}
	if err := q.EnsureGroup(ctx); err != nil {
		return err
	}
	var wg sync.WaitGroup
	if w.promoteEvery > 0 {
		wg.Add(1)
		go func() { defer wg.Done(); q.promoteLoop(ctx, w) }()
	}
	if w.reclaimEvery > 0 {
		wg.Add(1)
		go func() { defer wg.Done(); q.reclaimLoop(ctx, w, p, h) }()
	}
	err := q.readLoop(ctx, w, p, h)
	wg.Wait()
	return err
}

func (q *Queue) readLoop(ctx context.Context, w *worker, p backstop.Decider, h Handler) error {
	for ctx.Err() == nil {
		// The breaker refused a job: read nothing until it may half-open,
		// rather than take jobs only to defer them.
		if d := time.Until(time.UnixMilli(w.pausedUntil.Load())); d > 0 && !ctxtime.Sleep(ctx, d) {
			return nil
		}
		streams, err := q.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group: q.group, Consumer: w.consumer, Streams: []string{q.keys.Jobs, ">"},
			Count: w.batch, Block: w.block,
		}).Result()
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, redis.Nil):
			continue
		case err != nil && strings.Contains(err.Error(), "NOGROUP"):
			if err := q.EnsureGroup(ctx); err != nil {
				w.log.Warn("queue read failed", "queue", q.name, "err", err)
				ctxtime.Sleep(ctx, time.Second)
			}
			continue
		case err != nil:
			w.log.Warn("queue read failed", "queue", q.name, "err", err)
			ctxtime.Sleep(ctx, time.Second)
			continue
		}
		readAt := time.Now()
		var jobs []Job
		for _, s := range streams {
			for _, m := range s.Messages {
				jobs = append(jobs, jobFromMessage(m))
			}
		}
		for i, j := range jobs {
			q.process(ctx, w, p, h, j, readAt, jobs[i+1:])
		}
	}
	return nil
}

// process runs one job and applies its outcome (see settle). The outcome is
// applied with a context that outlives shutdown, so a finished job is never
// left pending for want of trying. waiting are the jobs read with j and not
// started yet: settle holds them too. A job that waited in the batch for
// half the min idle time is first held again (Hold): when another consumer
// reclaimed it meanwhile, it is skipped, not run a second time.
func (q *Queue) process(ctx context.Context, w *worker, p backstop.Decider, h Handler, j Job, readAt time.Time, waiting []Job) {
	if w.minIdle > 0 && time.Since(readAt) > w.minIdle/2 {
		hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.outcomeWait)
		held, err := q.Hold(hctx, w.consumer, j.EntryID)
		cancel()
		if err == nil && !held[0] {
			w.log.Info("queue job skipped: another consumer took it, or it was finished", "queue", q.name, "entry", j.EntryID, "job", j.ID)
			return
		}
	}
	// A job type with its own policy (WithPolicies) runs with it.
	rw, rp := w.policyFor(j.Type, p)
	stop := q.heartbeat(ctx, w, holdIDs(j, waiting))
	o := rw.run(ctx, rp, h, j)
	stop()
	q.settle(ctx, w, j, o, waiting)
}

// heartbeat holds the entries ids (a running job's first, then those
// waiting behind it) every third of the min idle time (at least 10ms) until
// stop, so that reclaim does not hand a job whose worker is alive to another
// consumer. Holding is best effort: a failure, or the first entry no longer
// held, is logged once.
func (q *Queue) heartbeat(ctx context.Context, w *worker, ids []string) (stop func()) {
	if w.minIdle <= 0 {
		return func() {}
	}
	hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		logged := false
		for ctxtime.Sleep(hctx, max(w.minIdle/3, 10*time.Millisecond)) {
			octx, cancel := context.WithTimeout(hctx, w.outcomeWait)
			held, err := q.Hold(octx, w.consumer, ids...)
			cancel()
			if (err != nil || !held[0]) && hctx.Err() == nil && !logged {
				logged = true
				w.log.Warn("queue entry not held while its handler runs", "queue", q.name, "entry", ids[0], "err", err)
			}
		}
	}()
	return func() { cancel(); <-done }
}

// run runs h on j (not a malformed entry) and decides the outcome: the
// worker's path from a delivery to an outcome, which the shared queue cases
// (testdata/queue) drive in every language.
func (w *worker) run(ctx context.Context, p backstop.Decider, h Handler, j Job) outcome {
	var err error
	if j.Malformed {
		err = errors.New("malformed entry: needs id, attempt >= 1 and first_enqueued_ms")
	} else if allowed, retryIn := w.permit(ctx, p); !allowed {
		// The breaker protects the dependency before the call: the handler
		// does not run, and the worker stops reading until it may half-open.
		w.metrics.Refused("circuit_open")
		w.pause(retryIn)
		if onOpen(p) == "dead_letter" {
			return outcome{action: "dead_letter", reason: "circuit_open", lastErr: "circuit breaker open: the job was not run"}
		}
		return outcome{action: "defer", reason: "circuit_open", delay: retryIn}
	} else {
		err = w.call(ctx, h, j)
	}
	// Deciding must not see shutdown either: a cancelled context would fail
	// a wasm policy's call.
	o := w.decide(context.WithoutCancel(ctx), p, j, err)
	if w.metrics != nil && !j.Malformed {
		w.count(context.WithoutCancel(ctx), p, o)
	}
	return o
}

// call runs h on j within the handler timeout (none when 0). The handler's
// ctx carries the deadline; a handler that fails once the deadline passed,
// or has not returned by then, fails the attempt with a deadlineError. One
// that ignores its ctx is left running, logged: the worker goes on.
func (w *worker) call(ctx context.Context, h Handler, j Job) error {
	if w.timeout <= 0 {
		return h(ctx, j)
	}
	dl := &deadlineError{w.timeout}
	hctx, cancel := context.WithTimeoutCause(ctx, w.timeout, dl)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- h(hctx, j) }()
	timer := time.NewTimer(w.timeout)
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
	case <-time.After(min(w.timeout/10, 100*time.Millisecond)):
		w.log.Warn("queue handler still running at its deadline; not waited for", "queue", w.name, "job", j.ID, "entry", j.EntryID, "timeout", w.timeout)
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

// count records a job's outcome in the worker's metrics.
func (w *worker) count(ctx context.Context, p backstop.Decider, o outcome) {
	switch o.action {
	case "ack":
		w.metrics.Attempt(clientmetrics.OutcomeSuccess)
	case "retry", "defer":
		w.metrics.Attempt(clientmetrics.OutcomeRetry)
		w.metrics.Retry(o.reason, o.delay)
	default:
		w.metrics.Attempt(clientmetrics.OutcomeDeadLetter)
	}
	if s, err := p.CircuitState(ctx, time.Now().UnixMilli()); err == nil {
		w.metrics.State(s)
	}
	if milli, ok, err := p.BudgetTokens(ctx, time.Now().UnixMilli()); err == nil && ok {
		w.metrics.Budget(milli)
	}
}

// decide turns the handler's result into an outcome, once: a success feeds
// the policy's budget and breaker, a failure is decided by the policy.
func (w *worker) decide(ctx context.Context, p backstop.Decider, j Job, herr error) outcome {
	if herr == nil {
		// Feed the policy's budget and breaker: a queue is traffic too.
		p.RecordSuccess(ctx, time.Now().UnixMilli())
		return outcome{action: "ack", reason: "success"} // the reason Node and Python report
	}
	if j.Malformed {
		return outcome{action: "dead_letter", reason: "malformed", lastErr: herr.Error()}
	}
	now := time.Now().UnixMilli()
	f := policy.Failure{
		Attempt: j.Attempt, IdempotencyKey: j.ID, NowMs: now, PrevDelayMs: max(0, j.PrevDelayMs),
		ElapsedMs: max(0, now-j.FirstEnqueuedMs), Random: w.rand(),
	}
	backstop.ClassifyError(herr, &f)
	d, err := p.Decide(ctx, f)
	if err != nil {
		return outcome{action: "dead_letter", reason: "malformed", lastErr: fmt.Sprintf("%v (policy refused the failure: %v)", herr, err)}
	}
	if d.Action == policy.Retry {
		return outcome{action: "retry", reason: d.Reason.String(), delay: d.Delay(), lastErr: herr.Error()}
	}
	if (d.Reason == policy.CircuitOpen || d.Reason == policy.BudgetExhausted) && onOpen(p) != "dead_letter" {
		// Not the job's fault: it waits, without spending an attempt.
		return outcome{action: "defer", reason: d.Reason.String(), delay: w.deferDelay(ctx, p, d), lastErr: herr.Error()}
	}
	return outcome{action: "dead_letter", reason: d.Reason.String(), lastErr: herr.Error()}
}

// permit asks p whether a job may run now (Acquire: while the breaker is
// open no job runs, half-open admits only its trials). A refusal carries
// how long until that may change (w.openPoll when the policy cannot say).
// A policy that cannot answer allows: its decision after the call still
// applies.
func (w *worker) permit(ctx context.Context, p backstop.Decider) (bool, time.Duration) {
	ctx = context.WithoutCancel(ctx)
	pm, err := p.Acquire(ctx, time.Now().UnixMilli())
	if err == nil {
		w.metrics.State(pm.State)
	}
	if err != nil || pm.Allowed {
		return true, 0
	}
	if pm.RetryInMs <= 0 {
		return false, w.openPoll
	}
	return false, time.Duration(pm.RetryInMs) * time.Millisecond
}

// deferDelay is how long a job refused by the breaker (until it may
// half-open) or the budget (the policy's backoff for the attempt) waits.
func (w *worker) deferDelay(ctx context.Context, p backstop.Decider, d policy.Decision) time.Duration {
	if d.Reason == policy.CircuitOpen {
		// The failure found (or made) the breaker open: Acquire refuses
		// and says until when, without taking a trial slot.
		allowed, retryIn := w.permit(ctx, p)
		if allowed {
			retryIn = w.openPoll
		}
		w.pause(retryIn)
		return retryIn
	}
	// budget_exhausted carries the policy's backoff for the attempt; it is
	// 0 only for a policy without one: wait openPoll rather than spin.
	if d.DelayMs > 0 {
		return d.Delay()
	}
	return w.openPoll
}

// pause stops the read loop for d from now (a later pause wins).
func (w *worker) pause(d time.Duration) {
	until := time.Now().Add(d).UnixMilli()
	for {
		cur := w.pausedUntil.Load()
		if cur >= until || w.pausedUntil.CompareAndSwap(cur, until) {
			return
		}
	}
}

// onOpen is the policy's on_open: "defer" (the default) or "dead_letter".
func onOpen(p backstop.Decider) string {
	if p.OnOpen() == "dead_letter" {
		return "dead_letter"
	}
	return "defer"
}

func (q *Queue) promoteLoop(ctx context.Context, w *worker) {
	for ctxtime.Sleep(ctx, jitter(w.promoteEvery)) {
		for {
			n, _, err := q.Promote(ctx, w.promoteLimit)
			if err != nil {
				w.log.Warn("queue promote failed", "queue", q.name, "err", err)
			}
			if err != nil || n < w.promoteLimit {
				break
			}
		}
	}
}

func (q *Queue) reclaimLoop(ctx context.Context, w *worker, p backstop.Decider, h Handler) {
	for ctxtime.Sleep(ctx, jitter(w.reclaimEvery)) {
		rec, err := q.Reclaim(ctx, w.consumer, w.minIdle, 100, w.maxDeliveries)
		if err != nil {
			w.log.Warn("queue reclaim failed", "queue", q.name, "err", err)
			continue
		}
		for _, s := range rec.Skipped {
			w.log.Error("queue crash loop not dead-lettered; it stays pending", "queue", q.name, "entry", s.EntryID, "err", s.Reason)
		}
		dead, jobs := rec.DeadLettered, rec.Jobs
		if dead > 0 {
			w.log.Warn("queue crash loops dead-lettered", "queue", q.name, "count", dead)
		}
		readAt := time.Now()
		for i, j := range jobs {
			q.process(ctx, w, p, h, j, readAt, jobs[i+1:])
		}
	}
}

// jitter spreads loop intervals ±20% so a fleet of workers does not poll
// Redis in step.
func jitter(d time.Duration) time.Duration {
	return d - d/5 + time.Duration(rand.Int64N(int64(d/5)*2+1))
}
