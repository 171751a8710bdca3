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
	outcomeWait   time.Duration
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
func (q *Queue) Work(ctx context.Context, p Decider, h Handler, opts ...WorkerOption) error {
	host, _ := os.Hostname()
	w := &worker{
		consumer: fmt.Sprintf("%s-%d", host, os.Getpid()), batch: 16, block: time.Second,
		promoteEvery: time.Second, promoteLimit: 500,
		reclaimEvery: 30 * time.Second, minIdle: time.Minute, maxDeliveries: 5,
		outcomeWait: 10 * time.Second, log: slog.Default(), rand: rand.Float64,
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
		for _, s := range streams {
			for _, m := range s.Messages {
				q.process(ctx, w, p, h, jobFromMessage(m))
			}
		}
	}
	return nil
}

// process runs one job and applies its outcome. The outcome is applied with
// a context that outlives shutdown, so a finished job is never left pending.
func (q *Queue) process(ctx context.Context, w *worker, p Decider, h Handler, j Job) {
	var err error
	if j.Malformed {
		err = errors.New("malformed entry: needs id, attempt >= 1 and first_enqueued_ms")
	} else {
		err = h(ctx, j)
	}
	octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.outcomeWait)
	defer cancel()
	if err := q.apply(octx, w, p, j, err); err != nil {
		// The entry stays pending; the reclaim loop will deliver it again.
		w.log.Error("queue outcome not applied", "queue", q.name, "entry", j.EntryID, "job", j.ID, "err", err)
	}
}

func (q *Queue) apply(ctx context.Context, w *worker, p Decider, j Job, herr error) error {
	if herr == nil {
		if s, ok := p.(successRecorder); ok {
			// Feed the policy's budget and breaker: a queue is traffic too.
			s.RecordSuccess(ctx, time.Now().UnixMilli())
		}
		_, err := q.Ack(ctx, j.EntryID)
		return err
	}
	if j.Malformed {
		_, err := q.DeadLetter(ctx, j.EntryID, "malformed", herr.Error())
		return err
	}
	now := time.Now().UnixMilli()
	f := policy.Failure{
		Attempt: j.Attempt, IdempotencyKey: j.ID, NowMs: now, PrevDelayMs: max(0, j.PrevDelayMs),
		ElapsedMs: max(0, now-j.FirstEnqueuedMs), Random: w.rand(),
	}
	ClassifyError(herr, &f)
	d, err := p.Decide(ctx, f)
	if err != nil {
		_, dlErr := q.DeadLetter(ctx, j.EntryID, "malformed", fmt.Sprintf("%v (policy refused the failure: %v)", herr, err))
		return dlErr
	}
	if d.Action == policy.Retry {
		_, _, err = q.Retry(ctx, j.EntryID, d.Delay(), d.Reason.String(), herr.Error())
		return err
	}
	_, err = q.DeadLetter(ctx, j.EntryID, d.Reason.String(), herr.Error())
	return err
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
		dead, jobs, err := q.Reclaim(ctx, w.consumer, w.minIdle, 100, w.maxDeliveries)
		if err != nil {
			w.log.Warn("queue reclaim failed", "queue", q.name, "err", err)
			continue
		}
		if dead > 0 {
			w.log.Warn("queue crash loops dead-lettered", "queue", q.name, "count", dead)
		}
		for _, j := range jobs {
			q.process(ctx, w, p, h, j)
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
