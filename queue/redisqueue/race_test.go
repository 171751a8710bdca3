package redisqueue_test

// Issue 40, "the same classes swept": the operator's commands (dlq replay,
// dlq purge, queue run --id) while workers run the queue, against a real
// redis-server.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// passCalls runs one pass of script (replay or discard) from cursor "-",
// one call at a time, calling between(i) after call i; it returns how many
// moved in all.
func passCalls(t *testing.T, ctx context.Context, rdb *redis.Client, name string, keys []string, args func(cursor string) []any, between func(i int)) int {
	t.Helper()
	moved := 0
	for i, cursor := 0, "-"; ; i++ {
		v, err := script(t, name).Run(ctx, rdb, keys, args(cursor)...).Slice()
		if err != nil {
			t.Fatalf("%s call %d: %v", name, i, err)
		}
		moved += int(v[0].(int64))
		if cursor = v[1].(string); cursor == "0" {
			return moved
		}
		if i > 100 {
			t.Fatalf("%s: a pass over a DLQ of a few dead letters is still going after %d calls", name, i)
		}
		between(i)
	}
}

// A pass of replay or discard (the calls from cursor "-" to "0") ends at
// the dead letter that was last when it began. Before, it read to the end
// of the stream as it was at each call: a job replayed by the pass and
// dead-lettered again by a worker (its fix not deployed yet) was replayed
// again by the same pass, and again, until the limit (a replay by id or
// with a filter could so loop for good at its rate); a purge discarded dead
// letters that came in after the operator ran it.
func TestDLQPassEndsWhereItBegan(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	for _, name := range []string{"replay", "discard"} {
		t.Run(name, func(t *testing.T) {
			q := redisqueue.New(rdb, "pass-"+name)
			deadLetters(t, ctx, rdb, q, [3]string{"a", "permanent_error", ""}, [3]string{"b", "permanent_error", ""},
				[3]string{"c", "permanent_error", ""})
			var keys []string
			var args func(cursor string) []any
			if name == "replay" {
				keys = []string{q.Keys().DLQ, q.Keys().Jobs, q.Keys().Stats}
				args = func(cursor string) []any { return []any{1, "permanent_error", cursor, 10} }
			} else {
				keys = []string{q.Keys().DLQ, q.AuditKey(), q.Keys().Stats}
				args = func(cursor string) []any {
					return []any{"purge", "sweep", "ann@ops", 1, cursor, 10, "permanent_error", "", ""}
				}
			}
			// After each call, a worker dead-letters what is in the stream
			// (a replayed job failing again) and a new job.
			added := map[string]bool{}
			moved := passCalls(t, ctx, rdb, name, keys, args, func(i int) {
				_, err := q.Enqueue(ctx, fmt.Sprint("new-", i), nil)
				runMust(t, err)
				for _, m := range read(t, ctx, rdb, q, "c1", 100) {
					id, err := q.DeadLetter(ctx, m.ID, "permanent_error", "boom again")
					runMust(t, err)
					added[id] = true
				}
			})
			if moved != 3 {
				t.Errorf("one pass moved %d dead letters, want the 3 there when it began", moved)
			}
			left := xrange(t, ctx, rdb, q.Keys().DLQ)
			if len(left) != len(added) {
				t.Errorf("DLQ holds %d, want the %d added during the pass", len(left), len(added))
			}
			for _, row := range left {
				if !added[row[0]] {
					t.Errorf("DLQ still holds %v, there before the pass", row)
				}
			}
			field := map[string]string{"replay": "replayed", "discard": "discarded"}[name]
			if c := counters(t, ctx, q)[field]; c != 3 {
				t.Errorf("%s = %d, want 3", field, c)
			}
		})
	}
}

// Issue 40: dlq replay and dlq purge while two workers run the queue, its
// failing jobs dead-lettered and replayed over and over: no dead letter
// is both replayed and discarded, none is lost or taken twice, each replay
// pass takes each job at most once, and the counters say what moved.
func TestReplayAndPurgeWhileWorkersRun(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	q := redisqueue.New(rdb, "sweep")
	runMust(t, q.EnsureGroup(ctx))
	p := nativePolicy(t, `{"max_attempts": 3, "backoff": {"strategy": "constant", "base": "5ms"}, "jitter": {"mode": "none"}}`)
	const bad, good = 60, 60
	var mu sync.Mutex
	runs := map[string]int{}       // job id: runs
	entries := map[string]string{} // entry id run: job id
	succeeded := map[string]int{}
	h := func(_ context.Context, j queue.Job) error {
		mu.Lock()
		defer mu.Unlock()
		runs[j.ID]++
		if prev, ok := entries[j.EntryID]; ok {
			t.Errorf("entry %s (job %s) ran twice; first as job %s", j.EntryID, j.ID, prev)
		}
		entries[j.EntryID] = j.ID
		switch {
		case strings.HasPrefix(j.ID, "bad-"):
			return &backstop.Failure{HTTPStatus: 400, Err: errors.New("400 bad request")}
		case j.Attempt == 1:
			return &backstop.Failure{HTTPStatus: 503, Err: errors.New("503 unavailable")}
		}
		succeeded[j.ID]++
		return nil
	}
	for _, c := range []string{"w1", "w2"} {
		work(t, q, p, h, redisqueue.WithConsumer(c), redisqueue.WithPromote(5*time.Millisecond, 500), redisqueue.WithBatch(4, 20*time.Millisecond))
	}
	for i := range bad {
		_, err := q.Enqueue(ctx, fmt.Sprint("bad-", i), nil)
		runMust(t, err)
		_, err = q.Enqueue(ctx, fmt.Sprint("good-", i), nil)
		runMust(t, err)
	}

	var wg sync.WaitGroup
	var replayed, discarded int
	passes := make(chan struct{}, 6) // a replay pass ended: a purge runs beside the next one
	wg.Add(2)
	go func() {
		defer wg.Done()
		defer close(passes)
		for range 6 {
			// A limit above the number of failing jobs: a pass that
			// chased its own replays would reach it.
			n, err := q.ReplayDeadLetters(ctx, redisqueue.ReplayOptions{Reason: "permanent_error", Limit: 1000, Rate: 400})
			if err != nil {
				t.Error(err)
				return
			}
			if n > bad {
				t.Errorf("one replay pass moved %d dead letters of %d failing jobs: it took jobs it had replayed itself", n, bad)
			}
			replayed += n
			passes <- struct{}{}
		}
	}()
	go func() {
		defer wg.Done()
		for range passes {
			n, err := q.Discard(ctx, redisqueue.DiscardOptions{Action: queue.DiscardPurge, Reason: "permanent_error", Limit: 7,
				Note: "sweep", Actor: "ann@ops"})
			if err != nil {
				t.Error(err)
				return
			}
			discarded += n
		}
	}()
	wg.Wait()
	// Every job settles: the failing ones in the DLQ or the audit, the
	// others succeeded.
	waitFor(t, "the queue to settle", func() bool {
		s, err := q.Stats(ctx)
		mu.Lock()
		defer mu.Unlock()
		return err == nil && s.Jobs == 0 && s.Pending == 0 && s.Delayed == 0 && len(succeeded) == good
	})

	mu.Lock()
	defer mu.Unlock()
	badRuns := 0
	for id, n := range runs {
		if strings.HasPrefix(id, "good-") && (n != 2 || succeeded[id] != 1) {
			t.Errorf("%s ran %d times, succeeded %d: want 2 and 1", id, n, succeeded[id])
		}
		if strings.HasPrefix(id, "bad-") {
			badRuns += n
		}
	}
	c := counters(t, ctx, q)
	// Each run of a failing job made one dead letter; each went one way.
	if c["dead_letters:permanent_error"] != int64(badRuns) {
		t.Errorf("dead_letters:permanent_error = %d, want %d (the failing runs)", c["dead_letters:permanent_error"], badRuns)
	}
	if c["replayed"] != int64(replayed) || int64(badRuns-bad) != c["replayed"] {
		t.Errorf("replayed = %d; the passes moved %d; the failing jobs ran %d times beyond their first", c["replayed"], replayed, badRuns-bad)
	}
	audit := xrange(t, ctx, rdb, q.AuditKey())
	if c["discarded"] != int64(discarded) || len(audit) != discarded {
		t.Errorf("discarded = %d; the purges moved %d; the audit holds %d", c["discarded"], discarded, len(audit))
	}
	// Each failing job ends once: in the DLQ or in the audit, never both,
	// each dead letter (its source entry, a run of the job) once.
	ends := map[string]int{}
	sources := map[string]bool{}
	for _, row := range append(xrange(t, ctx, rdb, q.Keys().DLQ), audit...) {
		f := fieldsOf(row)
		ends[f["id"]]++
		if sources[f["source_id"]] || entries[f["source_id"]] != f["id"] {
			t.Errorf("dead letter of entry %s (job %s): taken twice, or no run of that job made it", f["source_id"], f["id"])
		}
		sources[f["source_id"]] = true
	}
	for i := range bad {
		if id := fmt.Sprint("bad-", i); ends[id] != 1 {
			t.Errorf("%s is %d times in the DLQ and the audit, want once", id, ends[id])
		}
	}
	if replayed == 0 || discarded == 0 {
		t.Errorf("replayed %d, discarded %d: the race did not happen", replayed, discarded)
	}
}

// runCalls runs the run script by job id, one call at a time, calling
// between() after each call that returned a cursor to go on with; it
// returns how many moved in all.
func runCalls(t *testing.T, ctx context.Context, rdb *redis.Client, q *redisqueue.Queue, id string, between func()) int {
	t.Helper()
	moved := 0
	for cursor := "0"; ; {
		v, err := script(t, "run").Run(ctx, rdb, []string{q.Keys().Delayed, q.Keys().Jobs, q.Keys().Stats}, "id", id, cursor).Slice()
		runMust(t, err)
		moved += int(v[0].(int64))
		if cursor = v[1].(string); cursor == "0" {
			return moved
		}
		between()
	}
}

// queue run --id J reads the delayed set in bounded calls. When promote
// moved J between two of them and a worker ran it and retried it, the rest
// of the scan found J's new member and ran it a second time, at once
// instead of after its delay. A member written for a stream entry added
// after the scan began stays now: J runs once, by whichever moved it
// first.
func TestRunByIDDoesNotRunAPromotedJobTwice(t *testing.T) {
	rdb, q := queueWithFillers(t, "run-race")
	ctx := context.Background()
	for k := range 10 {
		id := fmt.Sprint("target-", k)
		// Due now: promote and run race for it.
		rdb.ZAdd(ctx, q.Keys().Delayed, redis.Z{Score: 0, Member: fmt.Sprintf(`{"id":%q,"attempt":2,"first_enqueued_ms":"1","source":"1-1"}`, id)})
		promoted, calls := 0, 0
		forced := runCalls(t, ctx, rdb, q, id, func() {
			if calls++; calls > 1 {
				return
			}
			// Between the first two calls, promote takes the job if the
			// run has not, a worker runs it and it fails: retried in an
			// hour, a member of attempt 3.
			n, _, err := q.Promote(ctx, 10)
			runMust(t, err)
			promoted = n
			msgs := read(t, ctx, rdb, q, "c1", 1)
			if len(msgs) != 1 || msgs[0].Values["id"] != id {
				t.Fatalf("read %v, want %s", msgs[0].Values, id)
			}
			_, _, err = q.Retry(ctx, msgs[0].ID, time.Hour, "transient", "503")
			runMust(t, err)
		})
		if calls < 2 {
			t.Fatalf("run scanned %s in %d calls; the test needs several", id, calls)
		}
		if forced+promoted != 1 {
			t.Errorf("%s: run moved %d, promote %d: want the job in the stream once", id, forced, promoted)
		}
		if n := rdb.ZCount(ctx, q.Keys().Delayed, "1000", "+inf").Val() - 30000; n != int64(k+1) {
			t.Errorf("%s: %d retried members wait in the set, want %d", id, n, k+1)
		}
	}
}

// Issue 40: `queue run --id` racing the workers' promote loop, for real:
// each job due at once is moved by one of them and runs once.
//
// The handler fails only once the run has returned. Otherwise promote,
// a worker and retry could all finish before the run's first call (a
// descheduled test goroutine is enough): the run then finds a job
// retried before it began, due in an hour, and rightly runs it now, as
// asked. A retry written during the scan is
// TestRunByIDDoesNotRunAPromotedJobTwice's, step by step.
func TestRunByIDRacingPromote(t *testing.T) {
	rdb, q := queueWithFillers(t, "run-promote")
	ctx := context.Background()
	p := nativePolicy(t, `{"max_attempts": 5, "backoff": {"strategy": "constant", "base": "1h", "cap": "1h"}, "jitter": {"mode": "none"}}`)
	var mu sync.Mutex
	runs := map[string]int{}
	returned := map[string]chan struct{}{} // closed once the run of that id returned
	runReturned := func(id string) chan struct{} {
		mu.Lock()
		defer mu.Unlock()
		if returned[id] == nil {
			returned[id] = make(chan struct{})
		}
		return returned[id]
	}
	work(t, q, p, func(ctx context.Context, j queue.Job) error {
		mu.Lock()
		runs[j.ID]++
		mu.Unlock()
		select {
		case <-runReturned(j.ID):
		case <-ctx.Done():
		}
		return &backstop.Failure{HTTPStatus: 503, Err: errors.New("503 unavailable")}
	}, redisqueue.WithPromote(time.Millisecond, 500), redisqueue.WithBatch(16, 10*time.Millisecond))
	const rounds = 20
	forced := 0
	for k := range rounds {
		id := fmt.Sprint("target-", k)
		now := serverTime(t, ctx, rdb)
		rdb.ZAdd(ctx, q.Keys().Delayed, redis.Z{Score: float64(now.UnixMilli() + int64(k%4)), Member: fmt.Sprintf(`{"id":%q,"attempt":1,"first_enqueued_ms":"%d"}`, id, now.UnixMilli())})
		r, err := q.Run(ctx, redisqueue.RunID(id))
		close(runReturned(id))
		runMust(t, err)
		forced += r.Moved
		// Settled: run once and back in the set, due in an hour.
		waitFor(t, id+" to be retried", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return runs[id] >= 1 && rdb.ZCount(ctx, q.Keys().Delayed, strconv.FormatInt(now.UnixMilli()+30*60*1000, 10), "(1e13").Val() == int64(k+1)
		})
	}
	s, err := q.Stats(ctx)
	runMust(t, err)
	if s.Jobs != 0 || s.Pending != 0 {
		t.Errorf("stream holds %d, %d pending: want none", s.Jobs, s.Pending)
	}
	mu.Lock()
	defer mu.Unlock()
	for k := range rounds {
		if id := fmt.Sprint("target-", k); runs[id] != 1 {
			t.Errorf("%s ran %d times, want once", id, runs[id])
		}
	}
	c := counters(t, ctx, q)
	if c["force_run"]+c["promoted"] != rounds || c["force_run"] != int64(forced) {
		t.Errorf("force_run %d + promoted %d, want %d (run moved %d)", c["force_run"], c["promoted"], rounds, forced)
	}
	t.Logf("run moved %d of %d, promote the rest", forced, rounds)
}

// queueWithFillers is queue name on a new redis-server, its group made and
// its delayed set holding 30,000 members due in centuries: a set that takes
// `queue run --id` several calls to scan.
func queueWithFillers(t *testing.T, name string) (*redis.Client, *redisqueue.Queue) {
	t.Helper()
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	q := redisqueue.New(rdb, name)
	runMust(t, q.EnsureGroup(ctx))
	pipe := rdb.Pipeline()
	for i := range 30000 {
		pipe.ZAdd(ctx, q.Keys().Delayed, redis.Z{Score: float64(1e13 + i), Member: fmt.Sprintf(`{"id":"filler-%d","attempt":2,"first_enqueued_ms":"1"}`, i)})
	}
	_, err := pipe.Exec(ctx)
	runMust(t, err)
	return rdb, q
}
