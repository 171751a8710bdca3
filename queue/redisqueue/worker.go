package redisqueue

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
	"github.com/backstop-dev/backstop/internal/ctxtime"
	"github.com/backstop-dev/backstop/queue"
)

// WorkOption configures Work.
type WorkOption func(*worker)

type worker struct {
	consumer      string
	batch         int64
	block         time.Duration
	promoteEvery  time.Duration
	promoteLimit  int
	reclaimEvery  time.Duration
	minIdle       time.Duration
	maxDeliveries int
	timeoutSet    bool          // WithHandlerTimeout given: else 5 times minIdle
	outcomeWait   time.Duration // per attempt at applying an outcome
	applyBase     time.Duration // first pause after Redis refused an outcome
	applyCap      time.Duration // longest pause (also capped at minIdle/4)
	refused       atomic.Int64  // outcomes Redis refused, every attempt counted
	log           *slog.Logger
	run           []queue.Option // the Runner's: WithHandlerTimeout, WithLogger, WithMetrics, WithPolicies
	runner        *queue.Runner
	clock         *serverClock     // Redis' clock: the one of first_enqueued_ms
	localNow      func() time.Time // the worker's own clock (time.Now; a test skews it)
}

// WithConsumer names this worker in the consumer group (default:
// hostname-pid).
func WithConsumer(name string) WorkOption { return func(w *worker) { w.consumer = name } }

// WithBatch sets how many entries one read takes (default 16) and how long
// it blocks waiting for them (default 1s).
func WithBatch(n int, block time.Duration) WorkOption {
	return func(w *worker) { w.batch, w.block = int64(n), block }
}

// WithPromote sets the interval of the promote loop (default 1s, jittered
// ±20%; 0 disables it) and its batch limit (default 500).
func WithPromote(every time.Duration, limit int) WorkOption {
	return func(w *worker) { w.promoteEvery, w.promoteLimit = every, limit }
}

// WithReclaim sets the interval of the reclaim loop (default 30s, jittered;
// 0 disables it), the idle time after which a pending entry is taken over
// (default 1m) and the delivery count that makes it a crash loop (default 5).
func WithReclaim(every, minIdle time.Duration, maxDeliveries int) WorkOption {
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
func WithHandlerTimeout(d time.Duration) WorkOption {
	return func(w *worker) { w.timeoutSet = true; w.run = append(w.run, queue.WithHandlerTimeout(d)) }
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) WorkOption {
	return func(w *worker) { w.log = l; w.run = append(w.run, queue.WithLogger(l)) }
}

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
func WithMetrics(reg prometheus.Registerer, policyName string) WorkOption {
	return func(w *worker) { w.run = append(w.run, queue.WithMetrics(reg, policyName)) }
}

// WithPolicies decides the jobs of some job types by their own policy, as
// queue.WithPolicies says: one Work loop can so serve a mixed stream. A
// type's breaker defers that type's jobs only: it does not pause the
// reading of the stream.
func WithPolicies(m map[string]backstop.Decider) WorkOption {
	return func(w *worker) { w.run = append(w.run, queue.WithPolicies(m)) }
}

// WithOutcomeHook has Work call h with every outcome it applies (the
// script ran on the job's pending entry), as queue.WithOutcomeHook says:
// for per-job alerting, such as paging on a dead letter of one job type.
func WithOutcomeHook(h queue.OutcomeHook) WorkOption {
	return func(w *worker) { w.run = append(w.run, queue.WithOutcomeHook(h)) }
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
func (q *Queue) Work(ctx context.Context, p backstop.Decider, h queue.Handler, opts ...WorkOption) error {
	w := &worker{
		consumer: defaultConsumer(), batch: 16, block: time.Second,
		promoteEvery: time.Second, promoteLimit: 500,
		reclaimEvery: 30 * time.Second, minIdle: time.Minute, maxDeliveries: 5,
		outcomeWait: 10 * time.Second, applyBase: 20 * time.Millisecond, applyCap: 2 * time.Second,
		log: slog.Default(),
	}
	for _, o := range opts {
		o(w)
	}
	w.clock = newServerClock(w.localNow)
	// The scripts stamp first_enqueued_ms with the server's clock: elapsed
	// time is measured on it (serverClock).
	run := append([]queue.Option{queue.WithEnqueueClock(w.clock.now)}, w.run...)
	if !w.timeoutSet {
		timeout := 5 * time.Minute
		if w.minIdle > 0 {
			timeout = 5 * w.minIdle
		}
		run = append([]queue.Option{queue.WithHandlerTimeout(timeout)}, run...)
	}
	r, err := queue.NewRunner(q.name, p, run...)
	if err != nil {
		return err
	}
	w.runner = r
	if err := q.EnsureGroup(ctx); err != nil {
		return err
	}
	w.clock.sync(ctx, q.rdb)
	var wg sync.WaitGroup
	if w.promoteEvery > 0 {
		wg.Add(1)
		go func() { defer wg.Done(); q.promoteLoop(ctx, w) }()
	}
	if w.reclaimEvery > 0 {
		wg.Add(1)
		go func() { defer wg.Done(); q.reclaimLoop(ctx, w, h) }()
	}
	err = q.readLoop(ctx, w, h)
	wg.Wait()
	return err
}

// defaultConsumer is a worker's name in the consumer group: hostname-pid.
func defaultConsumer() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s-%d", host, os.Getpid())
}

func (q *Queue) readLoop(ctx context.Context, w *worker, h queue.Handler) error {
	for ctx.Err() == nil {
		// The breaker refused a job: read nothing until it may half-open,
		// rather than take jobs only to defer them.
		if d := time.Until(w.runner.PausedUntil()); d > 0 && !ctxtime.Sleep(ctx, d) {
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
		var jobs []queue.Job
		for _, s := range streams {
			for _, m := range s.Messages {
				jobs = append(jobs, jobFromMessage(m))
			}
		}
		for i, j := range jobs {
			q.process(ctx, w, h, j, readAt, jobs[i+1:])
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
func (q *Queue) process(ctx context.Context, w *worker, h queue.Handler, j queue.Job, readAt time.Time, waiting []queue.Job) {
	if w.minIdle > 0 && time.Since(readAt) > w.minIdle/2 {
		hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.outcomeWait)
		held, err := q.Hold(hctx, w.consumer, j.EntryID)
		cancel()
		if err == nil && !held[0] {
			w.log.Info("queue job skipped: another consumer took it, or it was finished", "queue", q.name, "entry", j.EntryID, "job", j.ID)
			return
		}
	}
	o := malformed
	if !j.Malformed {
		w.clock.sync(ctx, q.rdb)
		stop := q.heartbeat(ctx, w, holdIDs(j, waiting))
		o = w.runner.Run(ctx, h, j)
		stop()
	}
	q.settle(ctx, w, j, o, waiting)
}

// malformed is the outcome of an entry that is not a job (Job.Malformed):
// dead-lettered without running.
var malformed = queue.Outcome{Action: queue.DeadLetter, Reason: "malformed", LastError: "malformed entry: needs id, attempt >= 1 and first_enqueued_ms"}

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

func (q *Queue) reclaimLoop(ctx context.Context, w *worker, h queue.Handler) {
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
			q.process(ctx, w, h, j, readAt, jobs[i+1:])
		}
	}
}

// jitter spreads loop intervals ±20% so a fleet of workers does not poll
// Redis in step.
func jitter(d time.Duration) time.Duration {
	return d - d/5 + time.Duration(rand.Int64N(int64(d/5)*2+1))
}
