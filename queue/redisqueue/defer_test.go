package redisqueue_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/host"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// breakerDecider is a queue decider that also tells the test the breaker's
// state: a native policy, or the same policy in backstop.wasm.
type breakerDecider interface {
	backstop.Decider
	CircuitState(ctx context.Context, nowMs int64) (policy.CircuitState, error)
}

// deciders loads src natively and through the wasm host.
func deciders(t *testing.T, src string) map[string]func(t *testing.T) breakerDecider {
	return map[string]func(t *testing.T) breakerDecider{
		"native": func(t *testing.T) breakerDecider {
			p, err := policy.Parse([]byte(src))
			if err != nil {
				t.Fatal(err)
			}
			return backstop.Native(p).(breakerDecider)
		},
		"wasm": func(t *testing.T) breakerDecider {
			ctx := context.Background()
			rt, err := host.New(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { rt.Close(ctx) })
			p, err := rt.Load(ctx, []byte(src))
			if err != nil {
				t.Fatal(err)
			}
			return p
		},
	}
}

// work runs q's worker until the test ends, and checks that it returns
// once stopped, even while it waits for the breaker.
func work(t *testing.T, q *redisqueue.Queue, p backstop.Decider, h queue.Handler, opts ...redisqueue.WorkOption) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- q.Work(ctx, p, h, opts...) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("work: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("the worker did not stop once its context was done")
		}
	})
}

func commandCalls(t *testing.T, rdb *redis.Client, cmd string) int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
			var n int64
			fmt.Sscan(strings.SplitN(rest, ",", 2)[0], &n)
			return n
		}
	}
	return 0
}

// An open breaker refuses a job before its handler runs: the job is
// deferred (its attempt unchanged, counted apart from retries) and the
// worker stops reading until the breaker may half-open, rather than take
// jobs only to defer them.
func TestOpenBreakerStopsTheWorker(t *testing.T) {
	const src = `{"max_attempts": 3, "backoff": {"base": "10ms", "cap": "20ms"}, "jitter": {"mode": "none"},
	 "circuit_breaker": {"failure_threshold": 1, "open_for": "1h"}}`
	for name, load := range deciders(t, src) {
		t.Run(name, func(t *testing.T) {
			rdb := redistest.Start(t).Client()
			ctx := context.Background()
			q := redisqueue.New(rdb, "stop")
			for i := range 10 {
				if _, err := q.Enqueue(ctx, fmt.Sprintf("job-%d", i), nil); err != nil {
					t.Fatal(err)
				}
			}
			p := load(t)
			var calls, whileOpen atomic.Int64
			work(t, q, p, func(ctx context.Context, j queue.Job) error {
				calls.Add(1)
				if s, _ := p.CircuitState(ctx, time.Now().UnixMilli()); s == policy.BreakerOpen {
					whileOpen.Add(1)
				}
				return &backstop.Failure{HTTPStatus: 503, Err: errors.New("503")}
			}, redisqueue.WithBatch(1, 20*time.Millisecond), redisqueue.WithPromote(10*time.Millisecond, 100),
				redisqueue.WithReclaim(0, time.Minute, 5), redisqueue.WithConsumer("w1"))

			// The first failure opens the breaker: that job is deferred
			// (circuit_open), not retried and not dead-lettered.
			waitFor(t, "the first job deferred", func() bool { return counters(t, ctx, q)["deferred:circuit_open"] == 1 })
			reads := commandCalls(t, rdb, "xreadgroup")
			promotes := commandCalls(t, rdb, "evalsha")
			// Let the promote loop run 20 times (10ms apart): a worker that
			// kept reading would have read the next job (20ms blocks) long
			// before.
			waitFor(t, "the promote loop to run on", func() bool { return commandCalls(t, rdb, "evalsha") >= promotes+20 })
			if n := commandCalls(t, rdb, "xreadgroup"); n != reads {
				t.Errorf("the worker read %d times while the breaker was open, want 0", n-reads)
			}
			if calls.Load() != 1 || whileOpen.Load() != 0 {
				t.Errorf("handler called %d times (%d while open), want once, before the breaker opened", calls.Load(), whileOpen.Load())
			}
			c := counters(t, ctx, q)
			if c["attempts:deferred"] != 1 || c["attempts:retry"] != 0 || c["attempts:dead_letter"] != 0 {
				t.Errorf("counters %v, want one deferral and no retry or dead letter", c)
			}
			members, err := rdb.ZRange(ctx, q.Keys().Delayed, 0, -1).Result()
			if err != nil || len(members) != 1 || !strings.Contains(members[0], `"attempt":1,`) || !strings.Contains(members[0], `"last_reason":"circuit_open"`) {
				t.Errorf("delayed set %q (%v), want job-0 at attempt 1, deferred for circuit_open", members, err)
			}
		})
	}
}

// The Done-when of issue 11 for the queue: an outage of the dependency with
// a breaker configured ends with no dead letter and every job done once it
// recovers, and no handler runs while the breaker is open. The same outage
// with on_open: dead_letter dead-letters jobs (the old behaviour).
func TestOutageWithBreakerLosesNoJob(t *testing.T) {
	const jobs = 12
	for _, onOpen := range []string{"defer", "dead_letter"} {
		src := `{"max_attempts": 3, "backoff": {"base": "10ms", "cap": "20ms"}, "jitter": {"mode": "none"},
		 "circuit_breaker": {"failure_threshold": 2, "open_for": "200ms"}, "on_open": "` + onOpen + `"}`
		for name, load := range deciders(t, src) {
			t.Run(onOpen+"/"+name, func(t *testing.T) {
				rdb := redistest.Start(t).Client()
				ctx := context.Background()
				q := redisqueue.New(rdb, "outage")
				for i := range jobs {
					if _, err := q.Enqueue(ctx, fmt.Sprintf("job-%d", i), nil); err != nil {
						t.Fatal(err)
					}
				}
				p := load(t)
				var down atomic.Bool
				down.Store(true)
				var whileOpen, downCalls atomic.Int64
				work(t, q, p, func(ctx context.Context, j queue.Job) error {
					if s, _ := p.CircuitState(ctx, time.Now().UnixMilli()); s == policy.BreakerOpen {
						whileOpen.Add(1)
					}
					if down.Load() {
						downCalls.Add(1)
						return &backstop.Failure{ErrorKind: "connection_refused", Err: errors.New("connection refused")}
					}
					return nil
				}, redisqueue.WithBatch(4, 20*time.Millisecond), redisqueue.WithPromote(10*time.Millisecond, 100),
					redisqueue.WithReclaim(0, time.Minute, 5), redisqueue.WithConsumer("w1"))

				if onOpen == "dead_letter" {
					waitFor(t, "dead letters", func() bool { return counters(t, ctx, q)["attempts:dead_letter"] > 0 })
					return
				}
				// The outage lasts until the breaker has opened, half-opened
				// and reopened on a failed trial, and jobs have waited it out.
				waitFor(t, "deferrals across a reopened breaker", func() bool {
					return counters(t, ctx, q)["deferred:circuit_open"] >= jobs && downCalls.Load() >= 4
				})
				down.Store(false)
				var c map[string]int64
				waitFor(t, "every job done", func() bool {
					c = counters(t, ctx, q)
					return c["attempts:success"] == jobs
				})
				if dlq, err := rdb.XLen(ctx, q.Keys().DLQ).Result(); err != nil || dlq != 0 || c["attempts:dead_letter"] != 0 {
					t.Errorf("%d dead letters (%v), counters %v; want none", dlq, err, c)
				}
				if n := whileOpen.Load(); n != 0 {
					t.Errorf("the handler ran %d times while the breaker was open", n)
				}
				// Every failure during the outage was a call the breaker let
				// through: the threshold, then one trial per half-open.
				if c["attempts:deferred"] < jobs || c["attempts:retry"]+c["attempts:deferred"] < downCalls.Load() {
					t.Errorf("counters %v after %d failed calls", c, downCalls.Load())
				}
			})
		}
	}
}

// A job the retry budget refuses waits its own backoff (the decision's
// delay_ms), in the wasm host too: the host has no backoff of its own to
// fall back on.
func TestBudgetRefusalDefersByBackoff(t *testing.T) {
	const src = `{"max_attempts": 5, "backoff": {"strategy": "constant", "base": "1h", "cap": "1h"}, "jitter": {"mode": "none"},
	 "retry_budget": {"max_tokens": 1, "token_ratio": 0.1}}`
	for name, load := range deciders(t, src) {
		t.Run(name, func(t *testing.T) {
			rdb := redistest.Start(t).Client()
			ctx := context.Background()
			q := redisqueue.New(rdb, "budget")
			before := time.Now().UnixMilli()
			if _, err := q.Enqueue(ctx, "job-0", nil); err != nil {
				t.Fatal(err)
			}
			work(t, q, load(t), func(ctx context.Context, j queue.Job) error {
				return &backstop.Failure{HTTPStatus: 503, Err: errors.New("503")}
			}, redisqueue.WithBatch(1, 20*time.Millisecond), redisqueue.WithReclaim(0, time.Minute, 5), redisqueue.WithConsumer("w1"))
			waitFor(t, "the job deferred", func() bool { return counters(t, ctx, q)["deferred:budget_exhausted"] == 1 })
			zs, err := rdb.ZRangeWithScores(ctx, q.Keys().Delayed, 0, -1).Result()
			if err != nil || len(zs) != 1 {
				t.Fatalf("delayed set %v (%v), want the job", zs, err)
			}
			// Due an hour after it ran (its backoff), not a poll interval.
			if due := int64(zs[0].Score); due < before+3_600_000 {
				t.Errorf("deferred until %d ms after enqueue, want >= 3600000 (the backoff)", due-before)
			}
		})
	}
}
