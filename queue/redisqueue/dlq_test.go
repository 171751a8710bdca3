package redisqueue_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// deadLetters enqueues one job per (id, reason, type) and dead-letters it
// (attempt 1, as the worker would on its first run).
func deadLetters(t *testing.T, ctx context.Context, rdb *redis.Client, q *redisqueue.Queue, jobs ...[3]string) {
	t.Helper()
	if err := q.EnsureGroup(ctx); err != nil {
		t.Fatal(err)
	}
	for _, j := range jobs {
		var opts []redisqueue.EnqueueOption
		if j[2] != "" {
			opts = append(opts, redisqueue.WithJobType(j[2]))
		}
		if _, err := q.Enqueue(ctx, j[0], []byte("payload-"+j[0]), opts...); err != nil {
			t.Fatal(err)
		}
		msgs := read(t, ctx, rdb, q, "c1", 1)
		if _, err := q.DeadLetter(ctx, msgs[0].ID, j[1], "boom "+j[0]); err != nil {
			t.Fatal(err)
		}
	}
}

func counter(t *testing.T, ctx context.Context, rdb *redis.Client, q *redisqueue.Queue, f string) string {
	t.Helper()
	v, err := rdb.HGet(ctx, q.Keys().Stats, f).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	return v
}

// Issue 27: dlq delete and purge discard dead letters with a recorded
// reason: each one is in the bounded audit stream {Q}:audit (action, note,
// actor, at_ms, then its own fields), gone from the DLQ, and counted.
func TestDiscardRecordsInTheAudit(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	q := redisqueue.New(rdb, "disc")
	deadLetters(t, ctx, rdb, q,
		[3]string{"a", "permanent_error", "send_email"}, [3]string{"b", "malformed", ""},
		[3]string{"c", "permanent_error", "charge_card"}, [3]string{"d", "permanent_error", "send_email"})
	before := xrange(t, ctx, rdb, q.Keys().DLQ)
	if q.AuditKey() != "{disc}:audit" {
		t.Fatalf("audit key %q", q.AuditKey())
	}
	n, err := q.Discard(ctx, redisqueue.DiscardOptions{Action: queue.DiscardDelete, ID: "b", Note: "bad input, fixed by hand", Actor: "ann@ops1"})
	if err != nil || n != 1 {
		t.Fatalf("delete b: %d %v", n, err)
	}
	audit := xrange(t, ctx, rdb, q.AuditKey())
	if len(audit) != 1 {
		t.Fatalf("audit: %v", audit)
	}
	row := audit[0]
	if strings.Join(row[1:9], " ") != "action delete note bad input, fixed by hand actor ann@ops1 at_ms "+row[8] {
		t.Errorf("audit head: %q", row[1:9])
	}
	if ms := fieldsOf(row)["at_ms"]; len(ms) != 13 {
		t.Errorf("at_ms %q", ms)
	}
	if got, want := strings.Join(row[9:], "\x00"), strings.Join(before[1][1:], "\x00"); got != want {
		t.Errorf("audit keeps %q, want the dead letter's fields %q", row[9:], before[1][1:])
	}
	if c := counter(t, ctx, rdb, q, "discarded"); c != "1" {
		t.Errorf("discarded = %q", c)
	}
	// Purge by reason and type, bounded.
	n, err = q.Discard(ctx, redisqueue.DiscardOptions{Action: queue.DiscardPurge, Reason: "permanent_error", JobType: "send_email", Limit: 1, Note: "incident-7", Actor: "bob@ops2"})
	if err != nil || n != 1 {
		t.Fatalf("purge: %d %v", n, err)
	}
	n, err = q.Discard(ctx, redisqueue.DiscardOptions{Action: queue.DiscardPurge, Reason: "permanent_error", JobType: "send_email", Note: "incident-7", Actor: "bob@ops2"})
	if err != nil || n != 1 {
		t.Fatalf("purge the rest: %d %v", n, err)
	}
	left := xrange(t, ctx, rdb, q.Keys().DLQ)
	if len(left) != 1 || fieldsOf(left[0])["id"] != "c" {
		t.Errorf("left in the DLQ: %v", left)
	}
	audit = xrange(t, ctx, rdb, q.AuditKey())
	if len(audit) != 3 || fieldsOf(audit[1])["id"] != "a" || fieldsOf(audit[2])["id"] != "d" || fieldsOf(audit[2])["action"] != "purge" {
		t.Errorf("audit: %v", audit)
	}
	if c := counter(t, ctx, rdb, q, "discarded"); c != "3" {
		t.Errorf("discarded = %q", c)
	}
	// An unknown id discards nothing.
	if n, err := q.Discard(ctx, redisqueue.DiscardOptions{Action: queue.DiscardDelete, ID: "zz", Note: "x", Actor: "y"}); err != nil || n != 0 {
		t.Errorf("delete zz: %d %v", n, err)
	}
	// Refused before Redis.
	for _, o := range []redisqueue.DiscardOptions{
		{Action: queue.DiscardDelete, Note: "x", Actor: "y"},
		{Action: "drop", Note: "x", Actor: "y"},
		{Action: queue.DiscardPurge, Actor: "y"},
		{Action: queue.DiscardPurge, Note: "x"},
		{Action: queue.DiscardPurge, Note: strings.Repeat("x", 1025), Actor: "y"},
		{Action: queue.DiscardPurge, Note: "x", Actor: "y", JobType: "a:b"},
	} {
		if _, err := q.Discard(ctx, o); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
}

// A purge of more dead letters than one call takes goes on in calls, and
// the audit stays bounded (MAXLEN ~ 10000).
func TestDiscardPurgesInBatchesAndTheAuditIsBounded(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	q := redisqueue.New(rdb, "many")
	p := rdb.Pipeline()
	for i := range 12000 {
		p.XAdd(ctx, &redis.XAddArgs{Stream: q.Keys().DLQ, Values: []string{"reason", "crash_loop", "id", fmt.Sprint("j", i)}})
	}
	if _, err := p.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	n, err := q.Discard(ctx, redisqueue.DiscardOptions{Action: queue.DiscardPurge, Note: "drain", Actor: "ops@here"})
	if err != nil || n != 12000 {
		t.Fatalf("purge: %d %v", n, err)
	}
	if l := rdb.XLen(ctx, q.Keys().DLQ).Val(); l != 0 {
		t.Errorf("DLQ holds %d", l)
	}
	if l := rdb.XLen(ctx, q.AuditKey()).Val(); l < 10000 || l > 11000 {
		t.Errorf("audit holds %d, want about 10000", l)
	}
	if c := counter(t, ctx, rdb, q, "discarded"); c != "12000" {
		t.Errorf("discarded = %q", c)
	}
}

// The discard script is all or nothing: bad ARGV, keys of the wrong type,
// a counter that cannot take the increment, an audit stream without ids
// left: refused, nothing written.
func TestDiscardScriptAllOrNothing(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	s := script(t, "discard")
	n := 0
	for _, c := range []struct {
		name, want string
		setup      func(q *redisqueue.Queue)
		argv       []any
	}{
		{"keys", "want 3 distinct keys", nil, nil},
		{"action", "action must be", nil, []any{"drop", "n", "a", 10, "-", 100, "", "", ""}},
		{"note", "note", nil, []any{"purge", "", "a", 10, "-", 100, "", "", ""}},
		{"actor", "actor", nil, []any{"purge", "n", "", 10, "-", 100, "", "", ""}},
		{"limit", "want limit", nil, []any{"purge", "n", "a", 0, "-", 100, "", "", ""}},
		{"scan", "want limit", nil, []any{"purge", "n", "a", 10, "-", 5, "", "", ""}},
		{"reason", "reason must be", nil, []any{"purge", "n", "a", 10, "-", 100, "a b", "", ""}},
		{"type", "type must be", nil, []any{"purge", "n", "a", 10, "-", 100, "", "a:b", ""}},
		{"delete-id", "delete needs a job id", nil, []any{"delete", "n", "a", 10, "-", 100, "", "", ""}},
		{"cursor", "cursor must be", nil, []any{"purge", "n", "a", 10, "5000", 100, "", "", ""}},
		{"dlq-type", "is a string, not a stream", func(q *redisqueue.Queue) {
			rdb.Del(ctx, q.Keys().DLQ)
			rdb.Set(ctx, q.Keys().DLQ, "x", 0)
		}, nil},
		{"audit-type", "is a hash, not a stream", func(q *redisqueue.Queue) { rdb.HSet(ctx, q.AuditKey(), "f", "v") }, nil},
		{"stats-type", "is a list, not a hash", func(q *redisqueue.Queue) {
			rdb.Del(ctx, q.Keys().Stats)
			rdb.RPush(ctx, q.Keys().Stats, "x")
		}, nil},
		{"counter", "HINCRBY cannot add", func(q *redisqueue.Queue) { rdb.HSet(ctx, q.Keys().Stats, "discarded", "9223372036854775807") }, nil},
		{"counter-text", "HINCRBY cannot add", func(q *redisqueue.Queue) { rdb.HSet(ctx, q.Keys().Stats, "discarded", "lots") }, nil},
		{"audit-exhausted", "cannot add to", func(q *redisqueue.Queue) {
			rdb.XAdd(ctx, &redis.XAddArgs{Stream: q.AuditKey(), ID: "18446744073709551615-18446744073709551615", Values: []string{"f", "v"}})
		}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			n++
			q := redisqueue.New(rdb, fmt.Sprintf("aond%d", n))
			deadLetters(t, ctx, rdb, q, [3]string{"a", "permanent_error", ""}, [3]string{"b", "permanent_error", ""})
			if c.setup != nil {
				c.setup(q)
			}
			keys := []string{q.Keys().DLQ, q.AuditKey(), q.Keys().Stats}
			if c.name == "keys" {
				keys = []string{q.Keys().DLQ, q.Keys().DLQ, q.Keys().Stats}
			}
			argv := c.argv
			if argv == nil {
				argv = []any{"purge", "note", "actor", 10, "-", 100, "", "", ""}
			}
			mustRefuse(t, ctx, rdb, "discard", c.want, func() error { return s.Run(ctx, rdb, keys, argv...).Err() })
		})
	}
}

// Issue 27: dlq replay --id replays one job's dead letters; --keep-attempts
// keeps the attempt and first_enqueued_ms on Redis too.
func TestReplayByIDKeepingAttempts(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	q := redisqueue.New(rdb, "rid")
	if err := q.EnsureGroup(ctx); err != nil {
		t.Fatal(err)
	}
	rdb.XAdd(ctx, &redis.XAddArgs{Stream: q.Keys().DLQ, Values: []string{"reason", "max_attempts_reached", "attempt", "5", "id", "a",
		"first_enqueued_ms", "1700000000000", "payload", "pa", "type", "send_email"}})
	rdb.XAdd(ctx, &redis.XAddArgs{Stream: q.Keys().DLQ, Values: []string{"reason", "transient", "attempt", "3", "id", "b",
		"first_enqueued_ms", "1700000000001", "payload", "pb"}})
	rdb.XAdd(ctx, &redis.XAddArgs{Stream: q.Keys().DLQ, Values: []string{"reason", "transient", "attempt", "x", "id", "c",
		"first_enqueued_ms", "1700000000002", "payload", "pc"}})
	n, err := q.ReplayDeadLetters(ctx, redisqueue.ReplayOptions{ID: "a", KeepAttempts: true})
	if err != nil || n != 1 {
		t.Fatalf("replay a: %d %v", n, err)
	}
	jobs := xrange(t, ctx, rdb, q.Keys().Jobs)
	if len(jobs) != 1 {
		t.Fatalf("jobs: %v", jobs)
	}
	f := fieldsOf(jobs[0])
	if f["id"] != "a" || f["attempt"] != "5" || f["first_enqueued_ms"] != "1700000000000" || f["payload"] != "pa" ||
		f["type"] != "send_email" || f["last_reason"] != "max_attempts_reached" {
		t.Errorf("replayed a: %v", f)
	}
	// A malformed attempt cannot be kept: that dead letter stays.
	n, err = q.ReplayDeadLetters(ctx, redisqueue.ReplayOptions{Limit: 10, KeepAttempts: true})
	if err != nil || n != 1 {
		t.Fatalf("replay kept: %d %v", n, err)
	}
	left := xrange(t, ctx, rdb, q.Keys().DLQ)
	if len(left) != 1 || fieldsOf(left[0])["id"] != "c" {
		t.Errorf("left: %v", left)
	}
	// Reset (the default) takes it.
	n, err = q.ReplayDeadLetters(ctx, redisqueue.ReplayOptions{ID: "c"})
	if err != nil || n != 1 {
		t.Fatalf("replay c: %d %v", n, err)
	}
	jobs = xrange(t, ctx, rdb, q.Keys().Jobs)
	if f := fieldsOf(jobs[2]); f["id"] != "c" || f["attempt"] != "1" || f["first_enqueued_ms"] == "1700000000002" {
		t.Errorf("replayed c: %v", f)
	}
	if c := counter(t, ctx, rdb, q, "replayed"); c != "3" {
		t.Errorf("replayed = %q", c)
	}
	if n, err := q.ReplayDeadLetters(ctx, redisqueue.ReplayOptions{}); err == nil {
		t.Errorf("no limit, no id: %d, no error", n)
	}
	mustRefuse(t, ctx, rdb, "replay", "keep attempts must be", func() error {
		return script(t, "replay").Run(ctx, rdb, []string{q.Keys().DLQ, q.Keys().Jobs, q.Keys().Stats}, 1, "", "-", 10, "", "yes").Err()
	})
}

// Issue 27: --rate paces a replay: batches of ceil(rate/10), one every
// batch/rate seconds, the first at once; a context that ends while it
// waits stops it with what moved so far.
func TestReplayRateIsPaced(t *testing.T) {
	p := queue.NewPacer(50, 1000)
	if p.Batch() != 5 || p.Interval() != 100*time.Millisecond {
		t.Errorf("pacer of 50/s: batch %d every %v", p.Batch(), p.Interval())
	}
	p.Stop()
	if p := queue.NewPacer(0.5, 1000); p.Batch() != 1 || p.Interval() != 2*time.Second {
		t.Errorf("pacer of 0.5/s: batch %d every %v", p.Batch(), p.Interval())
	}
	if p := queue.NewPacer(1e6, 1000); p.Batch() != 1000 || p.Interval() != time.Millisecond {
		t.Errorf("pacer of 1e6/s: batch %d every %v", p.Batch(), p.Interval())
	}
	for s, want := range map[string]float64{"10/s": 10, "120/m": 2, "0.5/s": 0.5, "3600/h": 1} {
		if got, err := queue.ParseRate(s); err != nil || got != want {
			t.Errorf("ParseRate(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"", "10", "0/s", "-1/s", "1e3/s", "inf/s", "NaN/s", "10/d", "0x10/s"} {
		if _, err := queue.ParseRate(s); err == nil {
			t.Errorf("ParseRate(%q): no error", s)
		}
	}

	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	q := redisqueue.New(rdb, "paced")
	for i := range 6 {
		rdb.XAdd(ctx, &redis.XAddArgs{Stream: q.Keys().DLQ, Values: []string{"reason", "transient", "id", fmt.Sprint("j", i)}})
	}
	// 20/s: batches of 2 every 100 ms; 6 dead letters take 3 batches, so
	// at least 200 ms.
	start := time.Now()
	n, err := q.ReplayDeadLetters(ctx, redisqueue.ReplayOptions{Limit: 6, Rate: 20})
	if err != nil || n != 6 {
		t.Fatalf("paced replay: %d %v", n, err)
	}
	if d := time.Since(start); d < 190*time.Millisecond {
		t.Errorf("6 dead letters at 20/s took %v, want >= 200ms", d)
	}
	for i := range 3 {
		rdb.XAdd(ctx, &redis.XAddArgs{Stream: q.Keys().DLQ, Values: []string{"reason", "transient", "id", fmt.Sprint("k", i)}})
	}
	// 0.1/s: the first at once, then the context (2 s) ends during the
	// 10 s wait.
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	n, err = q.ReplayDeadLetters(cctx, redisqueue.ReplayOptions{Limit: 3, Rate: 0.1})
	if n != 1 || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("replay at 0.1/s cancelled: %d %v; want 1 and the deadline", n, err)
	}
	if l := rdb.XLen(ctx, q.Keys().DLQ).Val(); l != 2 {
		t.Errorf("DLQ holds %d, want 2", l)
	}
}
