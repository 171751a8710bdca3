package redisqueue_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/internal/ctxtime"
	"github.com/backstop-dev/backstop/internal/testing/casetest"
	"github.com/backstop-dev/backstop/internal/testing/logbuf"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

func nativePolicy(t *testing.T, src string) backstop.Decider {
	t.Helper()
	p, err := policy.Parse([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return backstop.Native(p)
}

// A handler that runs three times the min idle time, while a second worker
// reclaims every 100ms, runs once: its worker holds the entry while it
// runs, and the entry read with it that waits its turn, so reclaim passes
// them by; both jobs are acked, each run once.
func TestLongHandlerIsNotReclaimed(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	q := redisqueue.New(rdb, "long")
	for _, id := range []string{"job-1", "job-2"} {
		if _, err := q.Enqueue(ctx, id, nil); err != nil {
			t.Fatal(err)
		}
	}
	const minIdle = time.Second
	p := nativePolicy(t, `{"max_attempts": 3}`)
	started := make(chan struct{})
	var calls, stolen atomic.Int64
	work(t, q, p, func(ctx context.Context, j queue.Job) error {
		if calls.Add(1) > 1 {
			return nil
		}
		close(started)
		if _, ok := ctx.Deadline(); !ok {
			t.Error("the handler's ctx has no deadline")
		}
		ctxtime.Sleep(ctx, 3*minIdle) // the work: longer than the min idle time
		return nil
	}, redisqueue.WithConsumer("a"), redisqueue.WithBatch(2, 50*time.Millisecond), redisqueue.WithReclaim(0, minIdle, 5))
	<-started
	work(t, q, p, func(context.Context, queue.Job) error {
		stolen.Add(1)
		return nil
	}, redisqueue.WithConsumer("b"), redisqueue.WithBatch(1, 50*time.Millisecond), redisqueue.WithReclaim(100*time.Millisecond, minIdle, 5))

	waitFor(t, "the jobs acked", func() bool { return counters(t, ctx, q)["attempts:success"] == 2 })
	c := counters(t, ctx, q)
	if calls.Load() != 2 || stolen.Load() != 0 || c["reclaimed"] != 0 {
		t.Errorf("the worker ran %d jobs, the second worker %d (reclaimed %d), want both and none", calls.Load(), stolen.Load(), c["reclaimed"])
	}
	pending, err := rdb.XPending(ctx, q.Keys().Jobs, q.Group()).Result()
	if err != nil || pending.Count != 0 {
		t.Errorf("pending %+v (%v), want none", pending, err)
	}
	if n, _ := rdb.ZCard(ctx, q.Keys().Delayed).Result(); n != 0 {
		t.Errorf("%d delayed jobs, want 0", n)
	}
	if n, _ := rdb.XLen(ctx, q.Keys().DLQ).Result(); n != 0 {
		t.Errorf("%d dead letters, want 0", n)
	}
}

// A handler that hangs past the handler timeout fails that attempt with a
// deadline, error kind timeout: the job is retried once (to the delayed
// set), whether the handler honours its ctx or ignores it (then it is left
// running, logged once).
func TestHandlerPastItsDeadlineIsRetried(t *testing.T) {
	for _, honours := range []bool{true, false} {
		t.Run(fmt.Sprintf("honours-ctx=%v", honours), func(t *testing.T) {
			rdb := redistest.Start(t).Client()
			ctx := context.Background()
			q := redisqueue.New(rdb, "hang")
			if _, err := q.Enqueue(ctx, "job-1", nil); err != nil {
				t.Fatal(err)
			}
			spy := &casetest.KindSpy{Decider: nativePolicy(t, `{"max_attempts": 3, "backoff": {"base": "1h", "cap": "1h"}, "jitter": {"mode": "none"}}`)}
			release := make(chan struct{})
			t.Cleanup(func() { close(release) })
			var calls atomic.Int64
			logs := &logbuf.Buffer{}
			work(t, q, spy, func(ctx context.Context, j queue.Job) error {
				calls.Add(1)
				if honours {
					<-ctx.Done()
					return ctx.Err()
				}
				<-release
				return nil
			}, redisqueue.WithConsumer("a"), redisqueue.WithBatch(1, 50*time.Millisecond), redisqueue.WithHandlerTimeout(300*time.Millisecond),
				redisqueue.WithLogger(slog.New(slog.NewTextHandler(logs, nil))))

			waitFor(t, "the job retried", func() bool { return counters(t, ctx, q)["attempts:retry"] == 1 })
			members, err := rdb.ZRange(ctx, q.Keys().Delayed, 0, -1).Result()
			if err != nil || len(members) != 1 || !strings.Contains(members[0], `"attempt":2,`) ||
				!strings.Contains(members[0], `"last_error":"handler deadline exceeded after 300ms"`) {
				t.Errorf("delayed set %q (%v), want job-1 at attempt 2 after the deadline", members, err)
			}
			c := counters(t, ctx, q)
			if kinds := spy.Kinds(); len(kinds) != 1 || kinds[0] != "timeout" || calls.Load() != 1 || c["retries:transient"] != 1 {
				t.Errorf("ran %d times, decided %q, counters %v: want one run, one timeout retried", calls.Load(), kinds, c)
			}
			if pending, err := rdb.XPending(ctx, q.Keys().Jobs, q.Group()).Result(); err != nil || pending.Count != 0 {
				t.Errorf("pending %+v (%v), want none", pending, err)
			}
			if n := strings.Count(logs.String(), "not waited for"); !honours && n != 1 {
				t.Errorf("logged the abandoned handler %d times, want once:\n%s", n, logs)
			}
		})
	}
}

func TestHandlerTimeoutMustBePositive(t *testing.T) {
	q := redisqueue.New(redistest.Start(t).Client(), "bad")
	for _, d := range []time.Duration{0, -time.Second} {
		err := q.Work(context.Background(), nativePolicy(t, `{}`), func(context.Context, queue.Job) error { return nil }, redisqueue.WithHandlerTimeout(d))
		if err == nil || !strings.Contains(err.Error(), "WithHandlerTimeout") {
			t.Errorf("WithHandlerTimeout(%v): Work returned %v, want an error naming the option", d, err)
		}
	}
	if _, err := queue.NewRunner("bad", nativePolicy(t, `{}`), queue.WithHandlerTimeout(0)); err == nil || !strings.Contains(err.Error(), "WithHandlerTimeout") {
		t.Errorf("NewRunner: %v, want an error naming WithHandlerTimeout", err)
	}
}
