package redisqueue_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// TestScripts runs the script semantics against a real standalone
// redis-server, a real 3-master Redis Cluster, and a master reached through
// a real Redis Sentinel.
func TestScripts(t *testing.T) {
	t.Run("standalone", func(t *testing.T) { scriptSuite(t, redistest.Start(t).Client()) })
	t.Run("cluster", func(t *testing.T) { scriptSuite(t, redistest.StartCluster(t, 3).Client(t)) })
	t.Run("sentinel", func(t *testing.T) { scriptSuite(t, redistest.StartSentinel(t, redistest.Start(t)).Client(t)) })
}

func scriptSuite(t *testing.T, rdb redis.UniversalClient) {
	cases := map[string]func(*testing.T, context.Context, redis.UniversalClient, *redisqueue.Queue){
		"enqueue":               testEnqueue,
		"ack":                   testAck,
		"retry":                 testRetry,
		"retry-validates":       testRetryValidates,
		"dead-letter":           testDeadLetter,
		"malformed":             testMalformed,
		"promote":               testPromote,
		"reclaim":               testReclaim,
		"replay":                testReplay,
		"worker":                testWorker,
		"custom-layout":         testCustomLayout,
		"outcome-after-move":    testOutcomeAfterMove,
		"stats-and-inspect":     testStatsAndInspect,
		"promote-malformed-set": testPromoteMalformedMember,
	}
	for name, fn := range cases {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			q := redisqueue.New(rdb, "t-"+name)
			if err := q.EnsureGroup(ctx); err != nil {
				t.Fatal(err)
			}
			fn(t, ctx, rdb, q)
		})
	}
}

// read takes n entries for consumer c.
func read(t *testing.T, ctx context.Context, rdb redis.UniversalClient, q *redisqueue.Queue, c string, n int64) []redis.XMessage {
	t.Helper()
	res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: q.Group(), Consumer: c, Streams: []string{q.Keys().Jobs, ">"}, Count: n, Block: -1}).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	if len(res) == 0 {
		return nil
	}
	return res[0].Messages
}

func counters(t *testing.T, ctx context.Context, q *redisqueue.Queue) map[string]int64 {
	t.Helper()
	s, err := q.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return s.Counters
}

func enqueueRead(t *testing.T, ctx context.Context, rdb redis.UniversalClient, q *redisqueue.Queue, id string) redis.XMessage {
	t.Helper()
	if _, err := q.Enqueue(ctx, id, []byte("payload-"+id)); err != nil {
		t.Fatal(err)
	}
	msgs := read(t, ctx, rdb, q, "c1", 1)
	if len(msgs) != 1 {
		t.Fatalf("read %d messages, want 1", len(msgs))
	}
	return msgs[0]
}

func testEnqueue(t *testing.T, ctx context.Context, rdb redis.UniversalClient, q *redisqueue.Queue) {
	m := enqueueRead(t, ctx, rdb, q, "job-1")
	if m.Values["id"] != "job-1" || m.Values["attempt"] != "1" || m.Values["payload"] != "payload-job-1" || m.Values["first_enqueued_ms"] == "" {
		t.Fatalf("entry fields: %v", m.Values)
	}
	if _, err := q.Enqueue(ctx, "", nil); err == nil || !strings.Contains(err.Error(), "job id must not be empty") {
		t.Fatalf("empty id: %v", err)
	}
	if c := counters(t, ctx, q); c["enqueued"] != 1 {
		t.Fatalf("enqueued = %d", c["enqueued"])
	}
}

func testAck(t *testing.T, ctx context.Context, rdb redis.UniversalClient, q *redisqueue.Queue) {
	m := enqueueRead(t, ctx, rdb, q, "job-1")
	if ok, err := q.Ack(ctx, m.ID); !ok || err != nil {
		t.Fatalf("ack: %v %v", ok, err)
	}
	if ok, err := q.Ack(ctx, m.ID); ok || err != nil {
		t.Fatalf("second ack: %v %v, want false", ok, err)
	}
	s, _ := q.Stats(ctx)
	if s.Jobs != 0 || s.Pending != 0 || s.Counters["attempts:success"] != 1 || s.Counters["finished:success:1"] != 1 || s.Counters["finished_sum:success"] != 1 {
		t.Fatalf("after ack: %+v", s)
	}
}

func testRetry(t *testing.T, ctx context.Context, rdb redis.UniversalClient, q *redisqueue.Queue) {
	m := enqueueRead(t, ctx, rdb, q, "job-1")
	before := time.Now()
	due, ok, err := q.Retry(ctx, m.ID, 5*time.Second, "transient", "503 Service Unavailable")
	if err != nil || !ok {
		t.Fatalf("retry: %v %v", ok, err)
	}
	if d := due.Sub(before); d < 4*time.Second || d > 6*time.Second {
		t.Fatalf("due in %v, want about 5s", d)
	}
	if _, ok, _ := q.Retry(ctx, m.ID, 0, "transient", "again"); ok {
		t.Fatal("a second retry of the same entry moved it again")
	}
	members, _ := rdb.ZRangeWithScores(ctx, q.Keys().Delayed, 0, -1).Result()
	if len(members) != 1 || int64(members[0].Score) != due.UnixMilli() {
		t.Fatalf("delayed set: %v", members)
	}
	var job map[string]any
	if err := json.Unmarshal([]byte(members[0].Member.(string)), &job); err != nil {
		t.Fatal(err)
	}
	if job["id"] != "job-1" || job["attempt"] != 2.0 || job["payload"] != "payload-job-1" || job["last_error"] != "503 Service Unavailable" {
		t.Fatalf("delayed member: %v", job)
	}
	s, _ := q.Stats(ctx)
	if s.Jobs != 0 || s.Pending != 0 || s.Delayed != 1 || s.Counters["attempts:retry"] != 1 || s.Counters["retries:transient"] != 1 {
		t.Fatalf("after retry: %+v", s)
	}
}

func testRetryValidates(t *testing.T, ctx context.Context, rdb redis.UniversalClient, q *redisqueue.Queue) {
	m := enqueueRead(t, ctx, rdb, q, "job-1")
	for _, c := range []struct {
		delay  time.Duration
		reason string
		want   string
	}{{-time.Second, "transient", "delay_ms must be"}, {time.Second, "", "reason must be transient, retry_after or uncertain"}} {
		if _, _, err := q.Retry(ctx, m.ID, c.delay, c.reason, "e"); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("retry(%v, %q): %v, want %q", c.delay, c.reason, err, c.want)
		}
	}
	s, _ := q.Stats(ctx)
	if s.Pending != 1 || s.Delayed != 0 || s.Counters["attempts:retry"] != 0 {
		t.Fatalf("a refused retry wrote something: %+v", s)
	}
}

func testDeadLetter(t *testing.T, ctx context.Context, rdb redis.UniversalClient, q *redisqueue.Queue) {
	m := enqueueRead(t, ctx, rdb, q, "job-1")
	id, err := q.DeadLetter(ctx, m.ID, "max_attempts_reached", "503 five times")
	if err != nil || id == "" {
		t.Fatalf("dead letter: %q %v", id, err)
	}
	if id2, _ := q.DeadLetter(ctx, m.ID, "max_attempts_reached", "again"); id2 != "" {
		t.Fatal("a second dead letter of the same entry wrote again")
	}
	dl, _ := rdb.XRange(ctx, q.Keys().DLQ, "-", "+").Result()
	v := dl[0].Values
	if len(dl) != 1 || v["reason"] != "max_attempts_reached" || v["error"] != "503 five times" || v["attempt"] != "1" || v["id"] != "job-1" || v["source_id"] != m.ID || v["payload"] != "payload-job-1" {
		t.Fatalf("dlq: %v", dl)
	}
	c := counters(t, ctx, q)
	if c["attempts:dead_letter"] != 1 || c["dead_letters:max_attempts_reached"] != 1 || c["max_attempts_reached"] != 1 || c["finished:dead_letter:1"] != 1 {
		t.Fatalf("counters: %v", c)
	}
}

func testMalformed(t *testing.T, ctx context.Context, rdb redis.UniversalClient, q *redisqueue.Queue) {
	rdb.XAdd(ctx, &redis.XAddArgs{Stream: q.Keys().Jobs, Values: []string{"attempt", "x", "garbage", "x"}})
	m := read(t, ctx, rdb, q, "c1", 1)[0]
	if _, _, err := q.Retry(ctx, m.ID, time.Second, "transient", "e"); err == nil || !strings.Contains(err.Error(), "malformed") {
		t.Fatalf("retry of a malformed entry: %v", err)
	}
	if id, err := q.DeadLetter(ctx, m.ID, "malformed", "no id"); id == "" || err != nil {
		t.Fatalf("dead letter malformed: %q %v", id, err)
	}
	s, _ := q.Stats(ctx)
	if s.Pending != 0 || s.DLQ != 1 || s.Counters["dead_letters:malformed"] != 1 {
		t.Fatalf("after malformed: %+v", s)
	}
}

func testPromote(t *testing.T, ctx context.Context, rdb redis.UniversalClient, q *redisqueue.Queue) {
	for _, id := range []string{"a", "b", "c"} {
		m := enqueueRead(t, ctx, rdb, q, id)
		if _, _, err := q.Retry(ctx, m.ID, 0, "transient", "e"); err != nil {
			t.Fatal(err)
		}
	}
	m := enqueueRead(t, ctx, rdb, q, "later")
	q.Retry(ctx, m.ID, time.Hour, "retry_after", "429")
	n, next, err := q.Promote(ctx, 2)
	if err != nil || n != 2 || next != 0 {
		t.Fatalf("promote limit 2: %d %v %v", n, next, err)
	}
	n, next, _ = q.Promote(ctx, 100)
	if n != 1 || next < 59*time.Minute || next > time.Hour {
		t.Fatalf("promote rest: %d, next %v", n, next)
	}
	msgs := read(t, ctx, rdb, q, "c1", 10)
	if len(msgs) != 3 {
		t.Fatalf("promoted %d entries to the stream, want 3", len(msgs))
	}
	for _, m := range msgs {
		if m.Values["attempt"] != "2" || m.Values["last_error"] != "e" || m.Values["last_reason"] != "transient" {
			t.Fatalf("promoted entry: %v", m.Values)
		}
	}
	if _, _, err := q.Promote(ctx, 0); err == nil {
		t.Fatal("promote limit 0 accepted")
	}
	if c := counters(t, ctx, q); c["promoted"] != 3 {
		t.Fatalf("promoted counter %d", c["promoted"])
	}
}

func testPromoteMalformedMember(t *testing.T, ctx context.Context, rdb redis.UniversalClient, q *redisqueue.Queue) {
	rdb.ZAdd(ctx, q.Keys().Delayed, redis.Z{Score: 1, Member: "not json"})
	if n, _, err := q.Promote(ctx, 10); n != 1 || err != nil {
		t.Fatalf("promote: %d %v", n, err)
	}
	m := read(t, ctx, rdb, q, "c1", 1)
	if len(m) != 1 || m[0].Values["malformed_delayed_member"] != "not json" {
		t.Fatalf("a malformed member must reach the stream, raw: %v", m)
	}
}

func testReclaim(t *testing.T, ctx context.Context, rdb redis.UniversalClient, q *redisqueue.Queue) {
	enqueueRead(t, ctx, rdb, q, "crashy")    // delivered once to c1, never acked
	q.Enqueue(ctx, "loopy", nil)             // delivered three times below
	read(t, ctx, rdb, q, "c1", 1)            // delivery 1
	r, err := q.Reclaim(ctx, "c2", 0, 10, 3) // crashy: delivery 2; loopy: delivery 2
	dead, jobs := r.DeadLettered, r.Jobs
	if err != nil || dead != 0 || len(jobs) != 2 || jobs[0].ID != "crashy" || jobs[0].Attempt != 1 {
		t.Fatalf("first reclaim: dead %d jobs %+v err %v", dead, jobs, err)
	}
	r, _ = q.Reclaim(ctx, "c3", 0, 10, 3) // delivery 3 for both
	dead, jobs = r.DeadLettered, r.Jobs
	if dead != 0 || len(jobs) != 2 {
		t.Fatalf("second reclaim: dead %d jobs %d", dead, len(jobs))
	}
	if ok, _ := q.Ack(ctx, jobs[0].EntryID); !ok {
		t.Fatal("ack of the reclaimed job failed")
	}
	r, _ = q.Reclaim(ctx, "c4", 0, 10, 3)
	dead, jobs = r.DeadLettered, r.Jobs
	if dead != 1 || len(jobs) != 0 {
		t.Fatalf("third reclaim: dead %d jobs %d, want the crash loop dead-lettered", dead, len(jobs))
	}
	dl, _ := rdb.XRange(ctx, q.Keys().DLQ, "-", "+").Result()
	if len(dl) != 1 || dl[0].Values["reason"] != "crash_loop" || dl[0].Values["id"] != "loopy" {
		t.Fatalf("dlq: %v", dl)
	}
	if _, err := q.Reclaim(ctx, "c4", 0, 0, 3); err == nil {
		t.Fatal("count 0 accepted")
	}
	// Entries idle less than min_idle stay with their consumer.
	enqueueRead(t, ctx, rdb, q, "fresh")
	if r, _ := q.Reclaim(ctx, "c5", time.Hour, 10, 3); len(r.Jobs) != 0 {
		t.Fatalf("claimed a fresh entry: %+v", r.Jobs)
	}
}

func testReplay(t *testing.T, ctx context.Context, rdb redis.UniversalClient, q *redisqueue.Queue) {
	for i, reason := range []string{"a", "b", "a", "b", "a"} {
		m := enqueueRead(t, ctx, rdb, q, "job-"+string(rune('0'+i)))
		q.DeadLetter(ctx, m.ID, reason, "e")
	}
	n, err := q.Replay(ctx, 10, "a")
	if err != nil || n != 3 {
		t.Fatalf("replay reason a: %d %v", n, err)
	}
	msgs := read(t, ctx, rdb, q, "c1", 10)
	if len(msgs) != 3 {
		t.Fatalf("%d replayed entries in the stream", len(msgs))
	}
	for _, m := range msgs {
		if m.Values["attempt"] != "1" || m.Values["last_reason"] != "a" || m.Values["replayed_from"] == "" {
			t.Fatalf("replayed entry %v", m.Values)
		}
	}
	if n, _ := q.Replay(ctx, 1, ""); n != 1 {
		t.Fatalf("replay limit 1 moved %d", n)
	}
	s, _ := q.Stats(ctx)
	if s.DLQ != 1 || s.Counters["replayed"] != 4 {
		t.Fatalf("after replay: %+v", s)
	}
}

// A worker applies the policy's decisions: two 503s, then success.
func testWorker(t *testing.T, ctx context.Context, rdb redis.UniversalClient, q *redisqueue.Queue) {
	p, err := policy.Parse([]byte(`{"max_attempts": 5, "backoff": {"base": "10ms", "cap": "20ms"}}`))
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	done := make(chan queue.Job, 1)
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	q.Enqueue(ctx, "job-1", []byte("x"))
	q.Enqueue(ctx, "job-bad", []byte("x"))
	go q.Work(ctx, backstop.Native(p), func(ctx context.Context, j queue.Job) error {
		if j.ID == "job-bad" {
			return &backstop.Failure{HTTPStatus: 400, Err: errors.New("400 Bad Request")}
		}
		if calls.Add(1) <= 2 {
			return &backstop.Failure{HTTPStatus: 503, Err: errors.New("503")}
		}
		done <- j
		return nil
	}, redisqueue.WithBatch(4, 50*time.Millisecond), redisqueue.WithPromote(10*time.Millisecond, 100), redisqueue.WithConsumer("w1"))
	var j queue.Job
	select {
	case j = <-done:
	case <-ctx.Done():
		t.Fatal("job never succeeded")
	}
	if j.Attempt != 3 || j.LastError != "503" {
		t.Fatalf("succeeded on %+v, want attempt 3 after a 503", j)
	}
	var c map[string]int64
	waitFor(t, "the counters to settle", func() bool {
		c = counters(t, ctx, q)
		return c["attempts:success"] == 1 && c["dead_letters:permanent_error"] == 1
	})
	if c["attempts:retry"] != 2 || c["finished:success:3"] != 1 {
		t.Fatalf("counters %v", c)
	}
}

// Key names are configurable, so existing layouts work.
func testCustomLayout(t *testing.T, ctx context.Context, rdb redis.UniversalClient, q *redisqueue.Queue) {
	k := redisqueue.Keys{Jobs: "{legacy}jobs:main", Delayed: "{legacy}delayed:retries", DLQ: "{legacy}jobs:dlq", Stats: "{legacy}stats"}
	lq := redisqueue.New(rdb, "legacy", redisqueue.WithKeys(k), redisqueue.WithGroup("g"))
	if err := lq.EnsureGroup(ctx); err != nil {
		t.Fatal(err)
	}
	m := enqueueRead(t, ctx, rdb, lq, "job-1")
	if _, _, err := lq.Retry(ctx, m.ID, 0, "transient", "e"); err != nil {
		t.Fatal(err)
	}
	if n, _ := rdb.ZCard(ctx, "{legacy}delayed:retries").Result(); n != 1 {
		t.Fatalf("custom delayed key holds %d", n)
	}
}

// Whoever moves an entry first wins: a late outcome from a worker whose
// entry was reclaimed and finished elsewhere changes nothing.
func testOutcomeAfterMove(t *testing.T, ctx context.Context, rdb redis.UniversalClient, q *redisqueue.Queue) {
	m := enqueueRead(t, ctx, rdb, q, "job-1")
	r, _ := q.Reclaim(ctx, "c2", 0, 10, 10)
	jobs := r.Jobs
	if len(jobs) != 1 {
		t.Fatal("reclaim")
	}
	if ok, _ := q.Ack(ctx, jobs[0].EntryID); !ok {
		t.Fatal("ack by the new owner")
	}
	if _, ok, _ := q.Retry(ctx, m.ID, 0, "transient", "late"); ok {
		t.Fatal("the late retry moved a finished job")
	}
	if id, _ := q.DeadLetter(ctx, m.ID, "permanent_error", "late"); id != "" {
		t.Fatal("the late dead letter moved a finished job")
	}
	s, _ := q.Stats(ctx)
	if s.Delayed != 0 || s.DLQ != 0 || s.Counters["attempts:success"] != 1 {
		t.Fatalf("after late outcomes: %+v", s)
	}
}

func testStatsAndInspect(t *testing.T, ctx context.Context, rdb redis.UniversalClient, q *redisqueue.Queue) {
	for i, reason := range []string{"permanent_error", "max_attempts_reached", "permanent_error"} {
		m := enqueueRead(t, ctx, rdb, q, "job-"+string(rune('a'+i)))
		q.DeadLetter(ctx, m.ID, reason, "e")
	}
	r, err := q.InspectDLQ(ctx, 2, 1000)
	if err != nil || r.Size != 3 || r.ByReason["permanent_error"] != 2 || len(r.Newest) != 2 || r.Newest[0].JobID != "job-c" {
		t.Fatalf("inspect: %+v %v", r, err)
	}
	if got := r.Reasons(); got[0] != "permanent_error" {
		t.Fatalf("reasons order %v", got)
	}
}

// Malformed attempts never fail a script half-way: the entry moves and the
// counters stay whole.
func TestHugeAttemptsDoNotHalfApply(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	q := redisqueue.New(rdb, "huge")
	q.EnsureGroup(ctx)
	for _, a := range []string{"inf", "1e300", "99999999999999999999999999", "-3", "2.0", "0x10"} {
		rdb.XAdd(ctx, &redis.XAddArgs{Stream: q.Keys().Jobs, Values: []string{"id", "j", "attempt", a, "first_enqueued_ms", "1"}})
		m := read(t, ctx, rdb, q, "c", 1)[0]
		if _, _, err := q.Retry(ctx, m.ID, 0, "transient", "e"); err == nil {
			t.Errorf("retry accepted attempt %q", a)
		}
		if id, err := q.DeadLetter(ctx, m.ID, "malformed", "bad attempt"); id == "" || err != nil {
			t.Errorf("dead letter of attempt %q: %q %v", a, id, err)
		}
	}
	rdb.XAdd(ctx, &redis.XAddArgs{Stream: q.Keys().Jobs, Values: []string{"id", "j", "attempt", "1e300", "first_enqueued_ms", "1"}})
	m := read(t, ctx, rdb, q, "c", 1)[0]
	if ok, err := q.Ack(ctx, m.ID); !ok || err != nil {
		t.Errorf("ack of a huge attempt: %v %v", ok, err)
	}
	s, _ := q.Stats(ctx)
	if s.Pending != 0 || s.DLQ != 6 || s.Counters["dead_letters:malformed"] != 6 || s.Counters["attempts:success"] != 1 {
		t.Errorf("after malformed attempts: %+v", s)
	}
}

// The delay of a cold retry comes back as the job's PrevDelayMs, so the
// decorrelated strategy keeps its memory across the delayed set.
func TestPrevDelayTravelsThroughTheDelayedSet(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	q := redisqueue.New(rdb, "prev")
	q.EnsureGroup(ctx)
	m := enqueueRead(t, ctx, rdb, q, "j")
	if _, _, err := q.Retry(ctx, m.ID, 25*time.Millisecond, "transient", "e"); err != nil {
		t.Fatal(err)
	}
	// Promote is a no-op until the due time passes on Redis's clock.
	waitFor(t, "the retry to be promoted", func() bool {
		n, _, _ := q.Promote(ctx, 10)
		return n == 1
	})
	if got := read(t, ctx, rdb, q, "c", 1)[0].Values["prev_delay_ms"]; got != "25" {
		t.Errorf("prev_delay_ms = %v, want 25", got)
	}
}

// A destination that cannot be written (a key of the wrong type in a
// legacy layout) fails the script before the ack: the job stays pending.
func TestFailedWriteLeavesTheEntryPending(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	q := redisqueue.New(rdb, "wrongtype")
	q.EnsureGroup(ctx)
	rdb.Set(ctx, q.Keys().DLQ, "legacy", 0)
	rdb.Set(ctx, q.Keys().Delayed, "legacy", 0)
	m := enqueueRead(t, ctx, rdb, q, "j")
	if _, err := q.DeadLetter(ctx, m.ID, "permanent_error", "e"); err == nil {
		t.Fatal("dead letter into a string key succeeded")
	}
	if _, _, err := q.Retry(ctx, m.ID, 0, "transient", "e"); err == nil {
		t.Fatal("retry into a string key succeeded")
	}
	if _, _, err := q.Retry(ctx, m.ID, 0, "because", "e"); err == nil {
		t.Fatal("an unknown retry reason was accepted")
	}
	if p, _ := rdb.XPending(ctx, q.Keys().Jobs, q.Group()).Result(); p.Count != 1 {
		t.Fatalf("the entry is no longer pending: %+v", p)
	}
}

// Crash loops and replays keep a malformed entry's body.
func TestMalformedBodiesAreNeverLost(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	q := redisqueue.New(rdb, "bodies")
	q.EnsureGroup(ctx)
	rdb.XAdd(ctx, &redis.XAddArgs{Stream: q.Keys().Jobs, Values: []string{"malformed_delayed_member", "raw body", "last_error", "boom"}})
	read(t, ctx, rdb, q, "c", 1)
	if r, err := q.Reclaim(ctx, "c2", 0, 10, 1); r.DeadLettered != 1 || err != nil {
		t.Fatalf("reclaim: %+v %v", r, err)
	}
	dl, _ := rdb.XRange(ctx, q.Keys().DLQ, "-", "+").Result()
	if len(dl) != 1 || dl[0].Values["entry.malformed_delayed_member"] != "raw body" || dl[0].Values["entry.last_error"] != "boom" {
		t.Fatalf("crash loop dead letter: %v", dl)
	}
	if n, err := q.Replay(ctx, 10, ""); n != 0 || err != nil {
		t.Fatalf("replayed %d id-less dead letters (%v)", n, err)
	}
	if n, _ := rdb.XLen(ctx, q.Keys().DLQ).Result(); n != 1 {
		t.Fatalf("the id-less dead letter left the DLQ")
	}
}
