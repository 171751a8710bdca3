package redisqueue_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/contract"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// delayJobs enqueues the jobs ids and retries each one delay after the
// last, so the first is due first.
func delayJobs(t *testing.T, ctx context.Context, rdb *redis.Client, q *redisqueue.Queue, delay time.Duration, ids ...string) {
	t.Helper()
	for i, id := range ids {
		if _, _, err := q.Retry(ctx, pendingEntry(t, ctx, rdb, q, id), time.Duration(i+1)*delay, "transient", "e"); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRunByID moves one delayed job to the stream now, whatever its due
// time, as the job retry wrote, and counts it in force_run; an unknown id
// moves nothing and says so; an id with glob characters matches itself
// only.
func TestRunByID(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	q := redisqueue.New(rdb, "run-id")
	runMust(t, q.EnsureGroup(ctx))
	delayJobs(t, ctx, rdb, q, time.Hour, "a", "b*", "b?", `q"uote`)

	for _, id := range []string{"b*", `q"uote`} {
		r, err := q.Run(ctx, redisqueue.RunID(id))
		if err != nil || r != (redisqueue.Ran{Moved: 1}) {
			t.Fatalf("run %q: %+v, %v; want 1 moved", id, r, err)
		}
	}
	msgs := read(t, ctx, rdb, q, "c1", 10)
	if len(msgs) != 2 || msgs[0].Values["id"] != "b*" || msgs[1].Values["id"] != `q"uote` {
		t.Fatalf("stream after run: %v", msgs)
	}
	if v := msgs[0].Values; v["attempt"] != "2" || v["last_error"] != "e" || v["last_reason"] != "transient" || v["first_enqueued_ms"] == "" {
		t.Fatalf("run moved %v, want the job retry wrote", v)
	}
	left, err := rdb.ZRange(ctx, q.Keys().Delayed, 0, -1).Result()
	runMust(t, err)
	if len(left) != 2 || !strings.Contains(left[0], `"a"`) || !strings.Contains(left[1], `"b?"`) {
		t.Fatalf("delayed set after run: %v", left)
	}
	if r, err := q.Run(ctx, redisqueue.RunID("missing")); err != nil || r != (redisqueue.Ran{}) {
		t.Fatalf("run of an unknown id: %+v, %v; want nothing moved", r, err)
	}
	if c := counters(t, ctx, q); c["force_run"] != 2 {
		t.Fatalf("force_run = %d, want 2", c["force_run"])
	}
}

// TestRunMalformedMember moves a member with the job id that promote would
// not rewrite (an unknown field, a fraction) raw, byte for byte, as promote
// does; one that is not JSON cannot be found by id.
func TestRunMalformedMember(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	q := redisqueue.New(rdb, "run-bad")
	runMust(t, q.EnsureGroup(ctx))
	bad := `{"id":"x","attempt":2.5,"extra":true}`
	runMust(t, rdb.ZAdd(ctx, q.Keys().Delayed, redis.Z{Score: 1e15, Member: bad}, redis.Z{Score: 1e15, Member: `"id":"y" not json`}).Err())
	if r, err := q.Run(ctx, redisqueue.RunID("x")); err != nil || r.Moved != 1 {
		t.Fatalf("run x: %+v, %v", r, err)
	}
	if r, err := q.Run(ctx, redisqueue.RunID("y")); err != nil || r.Moved != 0 {
		t.Fatalf("run y (not JSON): %+v, %v; want nothing moved", r, err)
	}
	m := read(t, ctx, rdb, q, "c1", 10)
	if len(m) != 1 || m[0].Values["malformed_delayed_member"] != bad || len(m[0].Values) != 1 {
		t.Fatalf("a malformed member must reach the stream raw: %v", m)
	}
}

// TestRunDueBefore moves the jobs due at or before a bound, at most limit
// of them, earliest first, and says how many are left before the bound;
// limits out of 1..10000 are refused before Redis.
func TestRunDueBefore(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	q := redisqueue.New(rdb, "run-before")
	runMust(t, q.EnsureGroup(ctx))
	delayJobs(t, ctx, rdb, q, time.Hour, "j1", "j2", "j3", "j4")
	bound := time.Now().Add(3*time.Hour + 30*time.Minute) // j1..j3
	r, err := q.Run(ctx, redisqueue.RunDueBefore(bound), redisqueue.RunLimit(2))
	if err != nil || r != (redisqueue.Ran{Moved: 2, Left: 1}) {
		t.Fatalf("run before, limit 2: %+v, %v; want 2 moved, 1 left", r, err)
	}
	r, err = q.Run(ctx, redisqueue.RunDueBefore(bound), redisqueue.RunLimit(2))
	if err != nil || r != (redisqueue.Ran{Moved: 1, Left: 0}) {
		t.Fatalf("run before again: %+v, %v; want 1 moved, 0 left", r, err)
	}
	msgs := read(t, ctx, rdb, q, "c1", 10)
	var ids []string
	for _, m := range msgs {
		ids = append(ids, fmt.Sprint(m.Values["id"]))
	}
	if strings.Join(ids, ",") != "j1,j2,j3" {
		t.Fatalf("moved %v, want j1,j2,j3 in due order", ids)
	}
	if c := counters(t, ctx, q); c["force_run"] != 3 {
		t.Fatalf("force_run = %d, want 3", c["force_run"])
	}
	for _, opts := range [][]redisqueue.RunOption{
		{redisqueue.RunDueBefore(bound), redisqueue.RunLimit(0)},
		{redisqueue.RunDueBefore(bound), redisqueue.RunLimit(redisqueue.MaxRunLimit + 1)},
		{redisqueue.RunDueBefore(bound), redisqueue.RunID("j4")},
		{},
	} {
		if _, err := q.Run(ctx, opts...); err == nil {
			t.Errorf("run with %d options accepted", len(opts))
		}
	}
	// The script bounds the limit too, for the hosts that send it.
	src, err := contract.ScriptSource("run")
	runMust(t, err)
	for _, limit := range []string{"0", "10001", "1e3", " 5"} {
		err := redis.NewScript(src).Run(ctx, rdb, []string{q.Keys().Delayed, q.Keys().Jobs, q.Keys().Stats}, "before", "1", limit).Err()
		if err == nil || !strings.Contains(err.Error(), "ERR backstop run: limit must be") {
			t.Errorf("run limit %q: %v", limit, err)
		}
	}
}

// TestRunAllOrNothing damages run's keys and counter in turn: it refuses
// and writes nothing.
func TestRunAllOrNothing(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	n := 0
	for _, c := range []struct {
		name, want string
		setup      func(q *redisqueue.Queue)
	}{
		{"counter not an integer", `field "force_run" holds " 1"`, func(q *redisqueue.Queue) { rdb.HSet(ctx, q.Keys().Stats, "force_run", " 1") }},
		{"counter would overflow", "HINCRBY cannot add 2", func(q *redisqueue.Queue) { rdb.HSet(ctx, q.Keys().Stats, "force_run", "9223372036854775806") }},
		{"no stream ids left", "exhausted", func(q *redisqueue.Queue) {
			rdb.XAdd(ctx, &redis.XAddArgs{Stream: q.Keys().Jobs, ID: "18446744073709551615-18446744073709551615", Values: []string{"f", "v"}})
		}},
		{"stats of the wrong type", "is a zset, not a hash", func(q *redisqueue.Queue) {
			rdb.Del(ctx, q.Keys().Stats)
			rdb.ZAdd(ctx, q.Keys().Stats, redis.Z{Member: "x"})
		}},
		{"delayed of the wrong type", "is a string, not a zset", func(q *redisqueue.Queue) {
			rdb.Del(ctx, q.Keys().Delayed)
			rdb.Set(ctx, q.Keys().Delayed, "x", 0)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			n++
			q := redisqueue.New(rdb, fmt.Sprintf("run-aon%d", n))
			runMust(t, q.EnsureGroup(ctx))
			delayJobs(t, ctx, rdb, q, time.Hour, "a", "b")
			c.setup(q)
			mustRefuse(t, ctx, rdb, "run", c.want, func() error {
				_, err := q.Run(ctx, redisqueue.RunDueBefore(time.Now().Add(24*time.Hour)))
				return err
			})
		})
	}
}

func runMust(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestRunByIDInBoundedCalls: in a set too large for one call, one call
// reads a part and returns a cursor; RunID goes on until the scan is done
// and finds a job wherever it is.
func TestRunByIDInBoundedCalls(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	q := redisqueue.New(rdb, "run-big")
	runMust(t, q.EnsureGroup(ctx))
	const n = 30000
	p := rdb.Pipeline()
	for i := range n {
		p.ZAdd(ctx, q.Keys().Delayed, redis.Z{Score: float64(1e13 + i), Member: fmt.Sprintf(`{"id":"job-%d","attempt":2,"first_enqueued_ms":"1"}`, i)})
	}
	_, err := p.Exec(ctx)
	runMust(t, err)
	src, err := contract.ScriptSource("run")
	runMust(t, err)
	v, err := redis.NewScript(src).Run(ctx, rdb, []string{q.Keys().Delayed, q.Keys().Jobs, q.Keys().Stats}, "id", "nope", "0").Slice()
	runMust(t, err)
	if v[0] != int64(0) || v[1] == "0" {
		t.Fatalf("one call over %d members: %v, want a cursor to go on with", n, v)
	}
	for _, cursor := range []string{"", "-1", "x", "0x10", "18446744073709551616", "5", "5@", "@5", "5@x", "18446744073709551616@5"} {
		err := redis.NewScript(src).Run(ctx, rdb, []string{q.Keys().Delayed, q.Keys().Jobs, q.Keys().Stats}, "id", "job-0", cursor).Err()
		if err == nil || !strings.Contains(err.Error(), "ERR backstop run: cursor must be") {
			t.Errorf("run cursor %q: %v", cursor, err)
		}
	}
	for _, id := range []string{"job-0", "job-29999", "job-12345"} {
		if r, err := q.Run(ctx, redisqueue.RunID(id)); err != nil || r.Moved != 1 {
			t.Fatalf("run %s: %+v, %v", id, r, err)
		}
	}
	if r, err := q.Run(ctx, redisqueue.RunID("job-0")); err != nil || r.Moved != 0 {
		t.Fatalf("run job-0 again: %+v, %v; want nothing moved", r, err)
	}
	if c, _ := rdb.ZCard(ctx, q.Keys().Delayed).Result(); c != n-3 {
		t.Fatalf("delayed set holds %d, want %d", c, n-3)
	}
}
