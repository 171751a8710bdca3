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

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/policy"
)

// Decider is a retry policy: a *host.Policy (backstop.wasm) or, through
// Native, a *policy.Policy.
type Decider interface {
	Decide(ctx context.Context, f policy.Failure) (policy.Decision, error)
}

// successRecorder is implemented by deciders with a retry budget or a
// circuit breaker to feed (*host.Policy, Native).
type successRecorder interface {
	RecordSuccess(ctx context.Context, nowMs int64) error
}

// Native adapts a native *policy.Policy to Decider.
func Native(p *policy.Policy) Decider { return nativeDecider{p} }

type nativeDecider struct{ p *policy.Policy }

func (n nativeDecider) Decide(_ context.Context, f policy.Failure) (policy.Decision, error) {
	return n.p.Decide(f)
}

func (n nativeDecider) RecordSuccess(_ context.Context, nowMs int64) error {
	n.p.RecordSuccess(nowMs)
	return nil
}

// Handler processes one job. A nil error acks it; an error is classified
// (see Failure and ClassifyError) and decided by the policy.
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
	outcomeWait   time.Duration // per attempt at applying an outcome
	applyBase     time.Duration // first pause after Redis refused an outcome
	applyCap      time.Duration // longest pause (also capped at minIdle/4)
	refused       atomic.Int64  // outcomes Redis refused, every attempt counted
	log           *slog.Logger
	rand          func() float64
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

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) WorkerOption { return func(w *worker) { w.log = l } }

// Work consumes the queue until ctx is done: it reads jobs with the
// consumer group, runs h, and applies the policy's decision through the
// scripts; alongside, it runs the promote loop and the reclaim loop. On
// shutdown it stops reading, lets the running handler finish, and applies
// its outcome before returning, so no outcome is lost.
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
func (q *Queue) Work(ctx context.Context, p Decider, h Handler, opts ...WorkerOption) error {
	host, _ := os.Hostname()
	w := &worker{
		consumer: fmt.Sprintf("%s-%d", host, os.Getpid()), batch: 16, block: time.Second,
		promoteEvery: time.Second, promoteLimit: 500,
		reclaimEvery: 30 * time.Second, minIdle: time.Minute, maxDeliveries: 5,
		outcomeWait: 10 * time.Second, applyBase: 20 * time.Millisecond, applyCap: 2 * time.Second,
		log: slog.Default(), rand: rand.Float64,
	}
	for _, o := range opts {
		o(w)
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

func (q *Queue) readLoop(ctx context.Context, w *worker, p Decider, h Handler) error {
	for ctx.Err() == nil {
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
				sleep(ctx, time.Second)
			}
			continue
		case err != nil:
			w.log.Warn("queue read failed", "queue", q.name, "err", err)
			sleep(ctx, time.Second)
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
func (q *Queue) process(ctx context.Context, w *worker, p Decider, h Handler, j Job, readAt time.Time, waiting []Job) {
	if w.minIdle > 0 && time.Since(readAt) > w.minIdle/2 {
		hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.outcomeWait)
		held, err := q.Hold(hctx, w.consumer, j.EntryID)
		cancel()
		if err == nil && !held[0] {
			w.log.Info("queue job skipped: another consumer took it, or it was finished", "queue", q.name, "entry", j.EntryID, "job", j.ID)
			return
		}
	}
	q.settle(ctx, w, j, q.run(ctx, w, p, h, j), waiting)
}

// run runs h on j (not a malformed entry) and decides the outcome: the
// worker's path from a delivery to an outcome, which the shared queue cases
// (testdata/queue) drive in every language.
func (q *Queue) run(ctx context.Context, w *worker, p Decider, h Handler, j Job) outcome {
	var err error
	if j.Malformed {
		err = errors.New("malformed entry: needs id, attempt >= 1 and first_enqueued_ms")
	} else {
		err = h(ctx, j)
	}
	// Deciding must not see shutdown either: a cancelled context would fail
	// a wasm policy's call.
	return q.decide(context.WithoutCancel(ctx), w, p, j, err)
}

// decide turns the handler's result into an outcome, once: a success feeds
// the policy's budget and breaker, a failure is decided by the policy.
func (q *Queue) decide(ctx context.Context, w *worker, p Decider, j Job, herr error) outcome {
	if herr == nil {
		if s, ok := p.(successRecorder); ok {
			// Feed the policy's budget and breaker: a queue is traffic too.
			s.RecordSuccess(ctx, time.Now().UnixMilli())
		}
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
	ClassifyError(herr, &f)
	d, err := p.Decide(ctx, f)
	if err != nil {
		return outcome{action: "dead_letter", reason: "malformed", lastErr: fmt.Sprintf("%v (policy refused the failure: %v)", herr, err)}
	}
	if d.Action == policy.Retry {
		return outcome{action: "retry", reason: d.Reason.String(), delay: d.Delay(), lastErr: herr.Error()}
	}
	return outcome{action: "dead_letter", reason: d.Reason.String(), lastErr: herr.Error()}
}

func (q *Queue) promoteLoop(ctx context.Context, w *worker) {
	for sleep(ctx, jitter(w.promoteEvery)) {
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

func (q *Queue) reclaimLoop(ctx context.Context, w *worker, p Decider, h Handler) {
	for sleep(ctx, jitter(w.reclaimEvery)) {
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

// sleep waits d or until ctx is done; it reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
