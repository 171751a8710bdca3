package redisqueue_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/internal/testing/logbuf"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// outOfMemory puts Redis in the state of a full server: a 4 MB filler, then
// maxmemory below the memory in use, with noeviction, so every command
// flagged denyoom (HINCRBY, ZADD, XADD...) is refused. It returns a func
// that lifts the limit.
func outOfMemory(t *testing.T, ctx context.Context, rdb *redis.Client) func() {
	t.Helper()
	if err := rdb.Set(ctx, "filler", strings.Repeat("x", 4<<20), 0).Err(); err != nil {
		t.Fatal(err)
	}
	info, err := rdb.Info(ctx, "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	var used int64
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			used, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	if used == 0 {
		t.Fatalf("no used_memory in INFO memory: %q", info)
	}
	for k, v := range map[string]string{"maxmemory-policy": "noeviction", "maxmemory": strconv.FormatInt(used/2, 10)} {
		if err := rdb.ConfigSet(ctx, k, v).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := rdb.Set(ctx, "probe", "x", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "OOM ") {
		t.Fatalf("SET under maxmemory: %v, want OOM", err)
	}
	return func() {
		t.Helper()
		if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// tail is the end of the log, for a failure message.
func tail(b *logbuf.Buffer) string {
	s := b.String()
	return s[max(0, len(s)-2000):]
}

// waitFor polls cond until it holds; it fails the test after a generous
// deadline (a hang, not a timing threshold).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	eventually.True(t, 30*time.Second, what, cond)
}

// serverTime is Redis's clock: the one XPENDING idle times and the promote
// script's due times are measured on.
func serverTime(t *testing.T, ctx context.Context, rdb redis.UniversalClient) time.Time {
	t.Helper()
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	return now
}

// Under maxmemory with noeviction Redis refuses ack, retry and dead_letter
// (their first write is flagged denyoom) but not XCLAIM, so reclaim can
// take an entry whose outcome the worker knows. A worker must keep the
// outcome and hold the job until Redis takes it: no job runs twice, and
// none that succeeded ends in the DLQ as a crash loop, while another
// consumer reclaims with a short min idle time the whole time.
func TestOutOfMemoryRunsEachJobOnce(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	q := redisqueue.New(rdb, "oom")
	if err := q.EnsureGroup(ctx); err != nil {
		t.Fatal(err)
	}
	p, err := policy.Parse([]byte(`{"max_attempts": 3, "backoff": {"base": "10ms", "cap": "20ms"}}`))
	if err != nil {
		t.Fatal(err)
	}
	// Batches of 4: flaky (a 503, then a success) and bad (a 400) each
	// start a batch, so that an outcome of each kind is refused, with
	// jobs of the batch waiting behind it.
	var ids []string
	for i := range 16 {
		ids = append(ids, map[int]string{0: "flaky", 4: "bad"}[i])
		if ids[i] == "" {
			ids[i] = fmt.Sprintf("ok-%d", i)
		}
		if _, err := q.Enqueue(ctx, ids[i], []byte("p")); err != nil {
			t.Fatal(err)
		}
	}

	var mu sync.Mutex
	runs := map[string]int{} // id/attempt → handler runs
	entered, gate := make(chan struct{}, 100), make(chan struct{})
	handler := func(_ context.Context, j queue.Job) error {
		mu.Lock()
		runs[fmt.Sprintf("%s/%d", j.ID, j.Attempt)]++
		mu.Unlock()
		entered <- struct{}{}
		<-gate
		switch {
		case j.ID == "bad":
			return &backstop.Failure{HTTPStatus: 400, Err: errors.New("400 bad request")}
		case j.ID == "flaky" && j.Attempt == 1:
			return &backstop.Failure{HTTPStatus: 503, Err: errors.New("503 unavailable")}
		}
		return nil
	}
	logs := &logbuf.Buffer{}
	logger := slog.New(slog.NewTextHandler(logs, nil))
	const minIdle = 400 * time.Millisecond
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, name := range []string{"w1", "w2"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			q.Work(wctx, backstop.Native(p), handler, redisqueue.WithConsumer(name), redisqueue.WithBatch(4, 20*time.Millisecond),
				redisqueue.WithPromote(20*time.Millisecond, 100), redisqueue.WithReclaim(20*time.Millisecond, minIdle, 2),
				redisqueue.WithLogger(logger))
		}()
	}
	defer func() { stop(); wg.Wait() }()

	// Both workers are running a job when Redis fills up; their outcomes
	// are refused. Another consumer reclaims meanwhile, as a worker in
	// another process would, for several min idle periods: it must find
	// nothing idle long enough to take.
	<-entered
	<-entered
	lift := outOfMemory(t, ctx, rdb)
	close(gate)
	// (XAUTOCLAIM takes what the reclaim script takes: entries idle for
	// min idle, whatever their consumer.)
	// The probing lasts until Redis's own clock, the one idle times are
	// measured on, has moved four min idle periods past the outage.
	var stolen []string
	start := serverTime(t, ctx, rdb)
	eventually.True(t, 30*time.Second, "four min idle periods of reclaim attempts", func() bool {
		msgs, _, _ := rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{Stream: q.Keys().Jobs, Group: q.Group(),
			MinIdle: minIdle, Start: "0-0", Count: 100, Consumer: "other"}).Result()
		for _, m := range msgs {
			stolen = append(stolen, fmt.Sprintf("%s/%s", m.Values["id"], m.Values["attempt"]))
		}
		return serverTime(t, ctx, rdb).Sub(start) >= 4*minIdle
	})
	lift()

	// Everything finishes: 15 successes (flaky on its second attempt), one
	// dead letter, nothing left pending.
	var s redisqueue.Stats
	waitFor(t, "every job to finish", func() bool {
		s, _ = q.Stats(ctx)
		return s.Counters["attempts:success"]+s.Counters["attempts:dead_letter"] >= int64(len(ids)) && s.Pending == 0
	})
	stop()
	wg.Wait()

	if len(stolen) > 0 {
		t.Errorf("another consumer reclaimed jobs whose outcome a worker held: %v", stolen)
	}
	mu.Lock()
	for key, n := range runs {
		if n != 1 {
			t.Errorf("%s ran %d times", key, n)
		}
	}
	if len(runs) != len(ids)+1 || runs["flaky/2"] != 1 {
		t.Errorf("runs %v, want each job once and flaky twice (attempts 1 and 2)", runs)
	}
	mu.Unlock()
	c := s.Counters
	if c["dead_letters:crash_loop"] != 0 || c["attempts:success"] != int64(len(ids)-1) || c["dead_letters:permanent_error"] != 1 ||
		c["attempts:retry"] != 1 || s.DLQ != 1 || s.Jobs != 0 || s.Delayed != 0 {
		t.Errorf("after the limit was lifted: %+v", s)
	}
	out := logs.String()
	for _, want := range []string{"queue outcome refused, retrying", "queue outcome applied after refusals"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in the worker's log, which ends:\n%s", want, tail(logs))
		}
	}
}

// A worker stopped while Redis refuses an outcome makes one last attempt,
// says the outcome was not applied, and returns: the entry stays pending
// (for reclaim), it is never dropped.
func TestStopWhileRefusedLeavesTheEntryPending(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	q := redisqueue.New(rdb, "oom-stop")
	q.EnsureGroup(ctx)
	p, _ := policy.Parse([]byte(`{"max_attempts": 3}`))
	q.Enqueue(ctx, "j", []byte("p"))
	logs := &logbuf.Buffer{}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	var ran atomic.Int64
	entered, gate := make(chan struct{}, 10), make(chan struct{})
	go func() {
		defer close(done)
		q.Work(wctx, backstop.Native(p), func(context.Context, queue.Job) error {
			ran.Add(1)
			entered <- struct{}{}
			<-gate
			return nil
		}, redisqueue.WithConsumer("w1"), redisqueue.WithBatch(1, 20*time.Millisecond), redisqueue.WithPromote(0, 1),
			redisqueue.WithReclaim(0, time.Minute, 5), redisqueue.WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	}()
	<-entered
	lift := outOfMemory(t, ctx, rdb)
	close(gate)
	waitFor(t, "a refused outcome", func() bool { return strings.Contains(logs.String(), "queue outcome") })
	stop()
	<-done
	lift()
	if !strings.Contains(logs.String(), "queue outcome not applied: the worker stopped") {
		t.Errorf("the worker did not say the outcome was not applied; its log ends:\n%s", tail(logs))
	}
	pending, err := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: q.Keys().Jobs, Group: q.Group(), Start: "-", End: "+", Count: 10}).Result()
	if err != nil || len(pending) != 1 || pending[0].Consumer != "w1" || ran.Load() != 1 {
		t.Errorf("pending %+v (%v) after %d runs, want the entry pending to w1 after one run", pending, err, ran.Load())
	}
}

// Redis refuses XGROUP CREATE when out of memory even for a group that
// exists: a worker started then must still start, and work once Redis takes
// writes again.
func TestWorkStartsWhileOutOfMemory(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	q := redisqueue.New(rdb, "oom-start")
	q.EnsureGroup(ctx)
	p, _ := policy.Parse([]byte(`{"max_attempts": 3}`))
	q.Enqueue(ctx, "j", []byte("p"))
	lift := outOfMemory(t, ctx, rdb)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	var ran atomic.Int64
	go func() {
		done <- q.Work(wctx, backstop.Native(p), func(context.Context, queue.Job) error { ran.Add(1); return nil },
			redisqueue.WithConsumer("w1"), redisqueue.WithBatch(1, 20*time.Millisecond), redisqueue.WithPromote(0, 1),
			redisqueue.WithLogger(slog.New(slog.DiscardHandler)))
	}()
	waitFor(t, "the job to run", func() bool {
		select {
		case err := <-done:
			t.Fatalf("the worker did not start under maxmemory: %v", err)
		default:
		}
		return ran.Load() == 1
	})
	lift()
	waitFor(t, "the job to be acked", func() bool {
		s, _ := q.Stats(ctx)
		return s.Counters["attempts:success"] == 1
	})
	stop()
	if err := <-done; err != nil || ran.Load() != 1 {
		t.Errorf("Work returned %v after %d runs", err, ran.Load())
	}
}

// Hold resets the idle time of entries the consumer holds, leaves their
// delivery count and other consumers' entries alone, and works when Redis
// is out of memory.
func TestHold(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	q := redisqueue.New(rdb, "hold")
	q.EnsureGroup(ctx)
	var ids []string
	for i := range 5 {
		id, _ := q.Enqueue(ctx, fmt.Sprintf("j%d", i), []byte("p"))
		ids = append(ids, id)
	}
	read(t, ctx, rdb, q, "c1", 5)
	rdb.XClaim(ctx, &redis.XClaimArgs{Stream: q.Keys().Jobs, Group: q.Group(), Consumer: "c2", Messages: ids[1:2]})
	q.Ack(ctx, ids[2])                   // finished
	rdb.XDel(ctx, q.Keys().Jobs, ids[3]) // data gone
	lift := outOfMemory(t, ctx, rdb)
	defer lift()
	if _, err := q.Ack(ctx, ids[4]); err == nil || !strings.Contains(err.Error(), "OOM") {
		t.Fatalf("ack under maxmemory: %v, want OOM", err)
	}
	// Hold resets idle time: let the entries go idle first, as Redis sees it.
	idle := func(id string) time.Duration {
		p, _ := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: q.Keys().Jobs, Group: q.Group(), Start: id, End: id, Count: 1}).Result()
		if len(p) == 0 {
			return 0
		}
		return p[0].Idle
	}
	eventually.True(t, 10*time.Second, "the pending entries idle for 20ms", func() bool {
		return idle(ids[0]) >= 20*time.Millisecond && idle(ids[1]) >= 20*time.Millisecond
	})
	held, err := q.Hold(ctx, "c1", ids...)
	if err != nil {
		t.Fatalf("hold under maxmemory: %v", err)
	}
	if want := []bool{true, false, false, false, true}; fmt.Sprint(held) != fmt.Sprint(want) {
		t.Fatalf("held %v, want %v", held, want)
	}
	pending, _ := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: q.Keys().Jobs, Group: q.Group(), Start: "-", End: "+", Count: 10}).Result()
	got := map[string]redis.XPendingExt{}
	for _, e := range pending {
		got[e.ID] = e
	}
	// Both entries were idle for 20ms before the hold: only the held one
	// started again, so it is now the less idle of the two.
	if e := got[ids[0]]; e.Consumer != "c1" || e.RetryCount != 1 || e.Idle >= got[ids[1]].Idle {
		t.Errorf("held entry: %+v, want c1's, delivered once, idle reset (other entry idle %v)", e, got[ids[1]].Idle)
	}
	if e := got[ids[1]]; e.Consumer != "c2" || e.Idle < 20*time.Millisecond {
		t.Errorf("another consumer's entry: %+v, want it left alone", e)
	}
	if _, ok := got[ids[3]]; ok {
		t.Errorf("an entry whose data is gone is still pending: %+v", got[ids[3]])
	}
	for _, bad := range [][]string{{"5"}, {"x-1"}, {ids[0] + " "}} {
		if _, err := q.Hold(ctx, "c1", bad...); err == nil || !strings.Contains(err.Error(), "ERR backstop hold") {
			t.Errorf("hold %q: %v, want a bad ARGV error", bad, err)
		}
	}
	if _, err := q.Hold(ctx, "", ids[0]); err == nil {
		t.Error("hold for an empty consumer name was accepted")
	}
}
