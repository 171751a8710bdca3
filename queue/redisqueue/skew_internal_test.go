package redisqueue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/queue"
)

// skewed is a worker clock off by d from the machine's.
func skewed(d time.Duration) WorkOption {
	return func(w *worker) { w.localNow = func() time.Time { return time.Now().Add(d) } }
}

// attemptSpan is when an attempt ran, by the server's clock.
type attemptSpan struct{ start, end time.Time }

// Issue 40, clock skew between Redis workers: the scripts stamp due times
// and first_enqueued_ms with the server's TIME, but the worker measured a
// job's elapsed time on its own clock. A worker 30 s ahead dead-lettered
// fresh jobs as max_elapsed_exceeded (20 s budget); one 30 s behind retried
// jobs 25 s old, past their budget. Now each worker measures elapsed time
// on the server's clock (serverClock): every worker decides alike. And no
// retry runs before its delay is over by the server's clock, whichever
// worker wrote it or runs it.
func TestSkewedWorkersJudgeTimeOnTheServersClock(t *testing.T) {
	srv := redistest.Start(t)
	const src = `{"max_attempts": 5, "max_elapsed": "20s", "backoff": {"strategy": "constant", "base": "200ms", "cap": "200ms"},
		"jitter": {"mode": "none"}}`
	pol, err := policy.Parse([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	for name, skews := range map[string][]time.Duration{
		"ahead": {30 * time.Second}, "behind": {-30 * time.Second}, "both": {30 * time.Second, -30 * time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			rdb := srv.Client()
			ctx := context.Background()
			q := New(rdb, "skew-"+name)
			if err := q.EnsureGroup(ctx); err != nil {
				t.Fatal(err)
			}
			serverNow := func() time.Time {
				now, err := rdb.Time(ctx).Result()
				if err != nil {
					t.Error(err)
				}
				return now
			}
			var mu sync.Mutex
			spans := map[string][]attemptSpan{}
			h := func(_ context.Context, j queue.Job) error {
				start := serverNow()
				mu.Lock()
				defer mu.Unlock()
				spans[j.ID] = append(spans[j.ID], attemptSpan{start: start})
				defer func() { spans[j.ID][len(spans[j.ID])-1].end = serverNow() }()
				if j.Attempt < 3 {
					return &backstop.Failure{HTTPStatus: 503, Err: errors.New("503 unavailable")}
				}
				return nil
			}
			const fresh, old = 8, 4
			for i := range fresh {
				if _, err := q.Enqueue(ctx, fmt.Sprint("fresh-", i), nil); err != nil {
					t.Fatal(err)
				}
			}
			// Jobs first enqueued 25 s ago: past their 20 s budget.
			for i := range old {
				rdb.XAdd(ctx, &redis.XAddArgs{Stream: q.Keys().Jobs, Values: []string{"id", fmt.Sprint("old-", i), "attempt", "1",
					"first_enqueued_ms", fmt.Sprint(serverNow().Add(-25 * time.Second).UnixMilli()), "payload", ""}})
			}
			wctx, cancel := context.WithCancel(ctx)
			var wg sync.WaitGroup
			for i, d := range skews {
				wg.Add(1)
				go func() {
					defer wg.Done()
					err := q.Work(wctx, backstop.Native(pol), h, WithConsumer(fmt.Sprint("w", i)), skewed(d),
						WithPromote(10*time.Millisecond, 500), WithBatch(1, 20*time.Millisecond))
					if err != nil {
						t.Error(err)
					}
				}()
			}
			eventually.True(t, 30*time.Second, "every job to finish", func() bool {
				s, err := q.Stats(ctx)
				return err == nil && s.Counters["attempts:success"]+s.Counters["attempts:dead_letter"] == fresh+old
			})
			cancel()
			wg.Wait()
			s, err := q.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if s.Counters["attempts:success"] != fresh || s.Counters["dead_letters:max_elapsed_exceeded"] != old {
				t.Errorf("%d succeeded, %d dead-lettered past their budget (%v): want the %d fresh jobs and the %d old ones",
					s.Counters["attempts:success"], s.Counters["dead_letters:max_elapsed_exceeded"], s.Counters, fresh, old)
			}
			mu.Lock()
			defer mu.Unlock()
			for id, runs := range spans {
				want := 3
				if id[:3] == "old" {
					want = 1
				}
				if len(runs) != want {
					t.Errorf("%s ran %d times, want %d", id, len(runs), want)
				}
				for i := 1; i < len(runs); i++ {
					// In whole ms, as the scripts keep due times: the retry's
					// due is TIME's ms (at or after the end) + 200.
					if early := runs[i-1].end.UnixMilli() + 200 - runs[i].start.UnixMilli(); early > 0 {
						t.Errorf("%s: attempt %d ran %dms before its 200ms delay was over (server clock)", id, i+1, early)
					}
				}
			}
		})
	}
}
