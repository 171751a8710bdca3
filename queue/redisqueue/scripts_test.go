package redisqueue_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/contract"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// The scripts run one at a time against one real redis-server per test;
// each case works on a queue of its own.

// script returns one of the contract's scripts, as every host loads it.
func script(t testing.TB, name string) *redis.Script {
	t.Helper()
	src, err := contract.ScriptSource(name)
	if err != nil {
		t.Fatal(err)
	}
	return redis.NewScript(src)
}

// snapshot is the whole dataset, DUMP by key: DUMP serializes a stream
// with its consumer groups, pending entries and delivery counts, which
// DEBUG DIGEST leaves out.
func snapshot(t testing.TB, ctx context.Context, rdb *redis.Client) map[string]string {
	t.Helper()
	out := map[string]string{}
	iter := rdb.Scan(ctx, 0, "*", 1000).Iterator()
	for iter.Next(ctx) {
		v, err := rdb.Dump(ctx, iter.Val()).Result()
		if err != nil {
			t.Fatal(err)
		}
		out[iter.Val()] = v
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// mustRefuse runs fn, which must fail with "ERR backstop <name>: ..."
// (containing want) and leave the dataset as it was.
func mustRefuse(t *testing.T, ctx context.Context, rdb *redis.Client, name, want string, fn func() error) {
	t.Helper()
	before := snapshot(t, ctx, rdb)
	err := fn()
	if err == nil || !strings.Contains(err.Error(), "ERR backstop "+name+": ") || !strings.Contains(err.Error(), want) {
		t.Errorf("%s: got error %v, want ERR backstop %s: ...%s...", name, err, name, want)
	}
	if after := snapshot(t, ctx, rdb); !maps.Equal(before, after) {
		t.Errorf("%s: refused (%v), yet it wrote: keys before %v, after %v", name, err, keysOf(before), keysOf(after))
	}
}

func keysOf(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// pendingEntry enqueues a job and reads it as consumer c1: a pending entry.
func pendingEntry(t *testing.T, ctx context.Context, rdb *redis.Client, q *redisqueue.Queue, id string) string {
	t.Helper()
	if err := q.EnsureGroup(ctx); err != nil {
		t.Fatal(err)
	}
	eid, err := q.Enqueue(ctx, id, []byte("payload-"+id))
	if err != nil {
		t.Fatal(err)
	}
	read(t, ctx, rdb, q, "c1", 100)
	return eid
}

// pendingRaw adds an entry with the given fields and reads it as c1.
func pendingRaw(t *testing.T, ctx context.Context, rdb *redis.Client, q *redisqueue.Queue, fields ...string) string {
	t.Helper()
	if err := q.EnsureGroup(ctx); err != nil {
		t.Fatal(err)
	}
	eid, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: q.Keys().Jobs, Values: fields}).Result()
	if err != nil {
		t.Fatal(err)
	}
	read(t, ctx, rdb, q, "c1", 100)
	return eid
}

// redeliver counts one more delivery of entry id, as a reclaim would.
func redeliver(t *testing.T, ctx context.Context, rdb *redis.Client, q *redisqueue.Queue, id string) {
	t.Helper()
	err := rdb.XClaim(ctx, &redis.XClaimArgs{Stream: q.Keys().Jobs, Group: q.Group(), Consumer: "c2", Messages: []string{id}}).Err()
	if err != nil {
		t.Fatal(err)
	}
}

// Issue 15, item 3: Redis does not roll a script back, so a write that
// fails half-way (a stats hash of the wrong type, a counter that is not an
// integer or would overflow, two KEYS that are one key, a stream without
// ids left, a retry already in the delayed set) duplicated or lost a job.
// Every script now checks what can make a write fail before its first one
// and refuses, writing nothing.
func TestScriptsApplyAllOrNothing(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	const maxInt64 = "9223372036854775807"
	n := 0
	fresh := func() *redisqueue.Queue {
		n++
		return redisqueue.New(rdb, fmt.Sprintf("aon%d", n))
	}
	hset := func(q *redisqueue.Queue, field, value string) {
		if err := rdb.HSet(ctx, q.Keys().Stats, field, value).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// A stream whose last id is the largest possible: XADD * fails.
	exhaust := func(key string) {
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: key, ID: "18446744073709551615-18446744073709551615", Values: []string{"f", "v"}}).Err(); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("enqueue", func(t *testing.T) {
		for _, c := range []struct {
			name, want string
			setup      func(q *redisqueue.Queue)
		}{
			{"stats of the wrong type", "is a string, not a hash", func(q *redisqueue.Queue) { rdb.Set(ctx, q.Keys().Stats, "legacy", 0) }},
			{"counter not an integer", `field "enqueued" holds "1.5"`, func(q *redisqueue.Queue) { hset(q, "enqueued", "1.5") }},
			{"counter with a leading zero", `holds "01"`, func(q *redisqueue.Queue) { hset(q, "enqueued", "01") }},
			{"counter at its maximum", "HINCRBY cannot add 1", func(q *redisqueue.Queue) { hset(q, "enqueued", maxInt64) }},
			{"no stream ids left", "exhausted", func(q *redisqueue.Queue) { exhaust(q.Keys().Jobs) }},
		} {
			t.Run(c.name, func(t *testing.T) {
				q := fresh()
				c.setup(q)
				mustRefuse(t, ctx, rdb, "enqueue", c.want, func() error { _, err := q.Enqueue(ctx, "j", nil); return err })
			})
		}
		q := fresh()
		mustRefuse(t, ctx, rdb, "enqueue", "distinct keys", func() error {
			return script(t, "enqueue").Run(ctx, rdb, []string{q.Keys().Jobs, q.Keys().Jobs}, "j", "p").Err()
		})
	})

	t.Run("ack", func(t *testing.T) {
		for _, c := range []struct {
			name, want string
			setup      func(q *redisqueue.Queue)
		}{
			{"stats of the wrong type", "is a list, not a hash", func(q *redisqueue.Queue) { rdb.Del(ctx, q.Keys().Stats); rdb.LPush(ctx, q.Keys().Stats, "x") }},
			// The first two HINCRBYs went through before the third failed.
			{"last counter not an integer", `field "finished_sum:success" holds "x"`, func(q *redisqueue.Queue) { hset(q, "finished_sum:success", "x") }},
			{"counter would overflow", "HINCRBY cannot add 1", func(q *redisqueue.Queue) { hset(q, "finished:success:1", maxInt64) }},
		} {
			t.Run(c.name, func(t *testing.T) {
				q := fresh()
				eid := pendingEntry(t, ctx, rdb, q, "j")
				c.setup(q)
				mustRefuse(t, ctx, rdb, "ack", c.want, func() error { _, err := q.Ack(ctx, eid); return err })
			})
		}
	})

	t.Run("retry", func(t *testing.T) {
		for _, c := range []struct {
			name, want string
			setup      func(q *redisqueue.Queue)
		}{
			// The case queue/redisqueue/README.md cited: ZADD, then HINCRBY failed.
			{"stats of the wrong type", "is a string, not a hash", func(q *redisqueue.Queue) { rdb.Set(ctx, q.Keys().Stats, "legacy", 0) }},
			{"counter not an integer", `field "retries:transient" holds "abc"`, func(q *redisqueue.Queue) { hset(q, "retries:transient", "abc") }},
			{"counter would overflow", "HINCRBY cannot add 1", func(q *redisqueue.Queue) { hset(q, "attempts:retry", maxInt64) }},
			{"delayed set of the wrong type", "is a hash, not a zset", func(q *redisqueue.Queue) { rdb.HSet(ctx, q.Keys().Delayed, "f", "v") }},
		} {
			t.Run(c.name, func(t *testing.T) {
				q := fresh()
				eid := pendingEntry(t, ctx, rdb, q, "j")
				c.setup(q)
				mustRefuse(t, ctx, rdb, "retry", c.want, func() error { _, _, err := q.Retry(ctx, eid, time.Second, "transient", "e"); return err })
			})
		}
		t.Run("delayed and stats one key", func(t *testing.T) {
			q := fresh()
			eid := pendingEntry(t, ctx, rdb, q, "j")
			k := q.Keys()
			mustRefuse(t, ctx, rdb, "retry", "distinct keys", func() error {
				return script(t, "retry").Run(ctx, rdb, []string{k.Jobs, k.Delayed, k.Delayed}, q.Group(), eid, 0, "transient", "e").Err()
			})
		})
		// The same retry of the same entry again (the stream was deleted
		// and made again, and the id came back): ZADD would only move the
		// member, two jobs in one.
		t.Run("member already there", func(t *testing.T) {
			q := fresh()
			eid := pendingEntry(t, ctx, rdb, q, "j")
			m, _ := rdb.XRange(ctx, q.Keys().Jobs, eid, eid).Result()
			if _, _, err := q.Retry(ctx, eid, time.Hour, "transient", "e"); err != nil {
				t.Fatal(err)
			}
			rdb.Del(ctx, q.Keys().Jobs)
			rdb.XAdd(ctx, &redis.XAddArgs{Stream: q.Keys().Jobs, ID: eid, Values: m[0].Values})
			if err := rdb.XGroupCreate(ctx, q.Keys().Jobs, q.Group(), "0").Err(); err != nil {
				t.Fatal(err)
			}
			read(t, ctx, rdb, q, "c1", 1)
			mustRefuse(t, ctx, rdb, "retry", "already holds this retry", func() error {
				_, _, err := q.Retry(ctx, eid, time.Hour, "transient", "e")
				return err
			})
		})
	})

	t.Run("defer", func(t *testing.T) {
		for _, c := range []struct {
			name, want string
			setup      func(q *redisqueue.Queue)
		}{
			{"stats of the wrong type", "is a string, not a hash", func(q *redisqueue.Queue) { rdb.Set(ctx, q.Keys().Stats, "legacy", 0) }},
			{"counter not an integer", `field "deferred:circuit_open" holds "abc"`, func(q *redisqueue.Queue) { hset(q, "deferred:circuit_open", "abc") }},
			{"counter would overflow", "HINCRBY cannot add 1", func(q *redisqueue.Queue) { hset(q, "attempts:deferred", maxInt64) }},
			{"delayed set of the wrong type", "is a hash, not a zset", func(q *redisqueue.Queue) { rdb.HSet(ctx, q.Keys().Delayed, "f", "v") }},
		} {
			t.Run(c.name, func(t *testing.T) {
				q := fresh()
				eid := pendingEntry(t, ctx, rdb, q, "j")
				c.setup(q)
				mustRefuse(t, ctx, rdb, "defer", c.want, func() error { _, _, err := q.Defer(ctx, eid, time.Second, "circuit_open", ""); return err })
			})
		}
		t.Run("delayed and stats one key", func(t *testing.T) {
			q := fresh()
			eid := pendingEntry(t, ctx, rdb, q, "j")
			k := q.Keys()
			mustRefuse(t, ctx, rdb, "defer", "distinct keys", func() error {
				return script(t, "defer").Run(ctx, rdb, []string{k.Jobs, k.Delayed, k.Delayed}, q.Group(), eid, 0, "circuit_open", "").Err()
			})
		})
	})

	t.Run("dead_letter", func(t *testing.T) {
		for _, c := range []struct {
			name, want string
			setup      func(q *redisqueue.Queue)
		}{
			{"stats of the wrong type", "is a string, not a hash", func(q *redisqueue.Queue) { rdb.Set(ctx, q.Keys().Stats, "legacy", 0) }},
			{"counter not an integer", `field "dead_letters:max_attempts_reached" holds "-0"`, func(q *redisqueue.Queue) { hset(q, "dead_letters:max_attempts_reached", "-0") }},
			{"last counter would overflow", "HINCRBY cannot add 1", func(q *redisqueue.Queue) { hset(q, "max_attempts_reached", maxInt64) }},
			{"dlq of the wrong type", "is a set, not a stream", func(q *redisqueue.Queue) { rdb.SAdd(ctx, q.Keys().DLQ, "x") }},
			{"no dlq ids left", "exhausted", func(q *redisqueue.Queue) { exhaust(q.Keys().DLQ) }},
		} {
			t.Run(c.name, func(t *testing.T) {
				q := fresh()
				eid := pendingEntry(t, ctx, rdb, q, "j")
				c.setup(q)
				mustRefuse(t, ctx, rdb, "dead_letter", c.want, func() error {
					_, err := q.DeadLetter(ctx, eid, "max_attempts_reached", "e")
					return err
				})
			})
		}
	})

	t.Run("promote", func(t *testing.T) {
		for _, c := range []struct {
			name, want string
			setup      func(q *redisqueue.Queue)
		}{
			{"counter not an integer", `field "promoted" holds " 1"`, func(q *redisqueue.Queue) { hset(q, "promoted", " 1") }},
			{"counter would overflow", "HINCRBY cannot add 2", func(q *redisqueue.Queue) { hset(q, "promoted", "9223372036854775806") }},
			{"no stream ids left", "exhausted", func(q *redisqueue.Queue) { exhaust(q.Keys().Jobs) }},
			{"stats of the wrong type", "is a zset, not a hash", func(q *redisqueue.Queue) {
				rdb.Del(ctx, q.Keys().Stats)
				rdb.ZAdd(ctx, q.Keys().Stats, redis.Z{Member: "x"})
			}},
		} {
			t.Run(c.name, func(t *testing.T) {
				q := fresh()
				for _, id := range []string{"a", "b"} {
					if _, _, err := q.Retry(ctx, pendingEntry(t, ctx, rdb, q, id), 0, "transient", "e"); err != nil {
						t.Fatal(err)
					}
				}
				c.setup(q)
				mustRefuse(t, ctx, rdb, "promote", c.want, func() error { _, _, err := q.Promote(ctx, 10); return err })
			})
		}
	})

	t.Run("reclaim", func(t *testing.T) {
		for _, c := range []struct {
			name, want string
			setup      func(q *redisqueue.Queue)
		}{
			{"crash loop counter not an integer", `field "finished_sum:dead_letter" holds "NaN"`, func(q *redisqueue.Queue) { hset(q, "finished_sum:dead_letter", "NaN") }},
			{"reclaimed counter would overflow", "HINCRBY cannot add 1", func(q *redisqueue.Queue) { hset(q, "reclaimed", maxInt64) }},
			{"stats of the wrong type", "is a string, not a hash", func(q *redisqueue.Queue) { rdb.Set(ctx, q.Keys().Stats, "legacy", 0) }},
		} {
			t.Run(c.name, func(t *testing.T) {
				q := fresh()
				redeliver(t, ctx, rdb, q, pendingEntry(t, ctx, rdb, q, "loop")) // delivery 2
				pendingEntry(t, ctx, rdb, q, "fresh")                           // delivery 1
				c.setup(q)
				// loop is a crash loop (2 deliveries), fresh is claimed.
				mustRefuse(t, ctx, rdb, "reclaim", c.want, func() error { _, err := q.Reclaim(ctx, "c3", 0, 10, 2); return err })
			})
		}
	})

	t.Run("replay", func(t *testing.T) {
		for _, c := range []struct {
			name, want string
			setup      func(q *redisqueue.Queue)
		}{
			{"counter not an integer", `field "replayed" holds "1e3"`, func(q *redisqueue.Queue) { hset(q, "replayed", "1e3") }},
			{"no stream ids left", "exhausted", func(q *redisqueue.Queue) { exhaust(q.Keys().Jobs) }},
			{"jobs of the wrong type", "is a hash, not a stream", func(q *redisqueue.Queue) {
				rdb.Del(ctx, q.Keys().Jobs)
				rdb.HSet(ctx, q.Keys().Jobs, "f", "v")
			}},
		} {
			t.Run(c.name, func(t *testing.T) {
				q := fresh()
				if _, err := q.DeadLetter(ctx, pendingEntry(t, ctx, rdb, q, "j"), "permanent_error", "e"); err != nil {
					t.Fatal(err)
				}
				c.setup(q)
				mustRefuse(t, ctx, rdb, "replay", c.want, func() error { _, err := q.Replay(ctx, 10, ""); return err })
			})
		}
	})
}

// Issue 15, item 7: "5000" is not the entry 5000-1 (XPENDING read it as a
// range and matched 5000-1, XACK as 5000-0 and acked nothing, and a success
// was counted). An entry id must be a full stream id, and every other ARGV
// is read strictly too (Lua's tonumber takes "0x10", "1e3", " 5", "inf").
func TestScriptsRefuseBadArguments(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	q := redisqueue.New(rdb, "argv")
	rdb.XGroupCreateMkStream(ctx, q.Keys().Jobs, q.Group(), "0")
	rdb.XAdd(ctx, &redis.XAddArgs{Stream: q.Keys().Jobs, ID: "5000-1", Values: []string{"id", "j", "attempt", "1", "first_enqueued_ms", "1"}})
	read(t, ctx, rdb, q, "c1", 1)
	m := pendingEntry(t, ctx, rdb, q, "dl")
	if _, err := q.DeadLetter(ctx, m, "permanent_error", "e"); err != nil {
		t.Fatal(err)
	}
	k := q.Keys()
	jobs := []string{k.Jobs, k.Stats}
	three := map[string][]string{
		"retry": {k.Jobs, k.Delayed, k.Stats}, "defer": {k.Jobs, k.Delayed, k.Stats}, "dead_letter": {k.Jobs, k.DLQ, k.Stats}, "promote": {k.Delayed, k.Jobs, k.Stats},
		"reclaim": {k.Jobs, k.DLQ, k.Stats}, "replay": {k.DLQ, k.Jobs, k.Stats},
	}
	badIDs := []string{"5000", "5000-", "-5000-1", "+", "-", "(5000-1", "5000-01", "05000-1", " 5000-1", "5000-1 ", "0x1388-1",
		"5000-1-1", "18446744073709551616-1", "5000-18446744073709551616", "", "5000-1\x00"}
	for _, c := range []struct {
		script string
		keys   []string
		args   []any
		want   string
	}{
		{"enqueue", jobs, []any{""}, "job id must not be empty"},
		{"ack", jobs, []any{"", "5000-1"}, "group must not be empty"},
		{"retry", three["retry"], []any{"workers", "5000-1", "0x10", "transient", "e"}, "delay_ms"},
		{"retry", three["retry"], []any{"workers", "5000-1", "1e3", "transient", "e"}, "delay_ms"},
		{"retry", three["retry"], []any{"workers", "5000-1", " 5", "transient", "e"}, "delay_ms"},
		{"retry", three["retry"], []any{"workers", "5000-1", "inf", "transient", "e"}, "delay_ms"},
		{"retry", three["retry"], []any{"workers", "5000-1", "nan", "transient", "e"}, "delay_ms"},
		{"retry", three["retry"], []any{"workers", "5000-1", "5.0", "transient", "e"}, "delay_ms"},
		{"retry", three["retry"], []any{"workers", "5000-1", "10", "Transient", "e"}, "reason must be"},
		{"defer", three["defer"], []any{"workers", "5000-1", "1e3", "circuit_open", ""}, "delay_ms"},
		{"defer", three["defer"], []any{"workers", "5000-1", "10", "transient", ""}, "reason must be circuit_open or budget_exhausted"},
		{"defer", three["defer"], []any{"workers", "5000", "10", "circuit_open", ""}, "full stream id"},
		{"dead_letter", three["dead_letter"], []any{"workers", "5000-1", "two words", "e"}, "printable ASCII"},
		{"dead_letter", three["dead_letter"], []any{"workers", "5000-1", "caf\xc3\xa9", "e"}, "printable ASCII"},
		{"dead_letter", three["dead_letter"], []any{"workers", "5000-1", strings.Repeat("r", 129), "e"}, "printable ASCII"},
		{"dead_letter", three["dead_letter"], []any{"workers", "5000-1", "line\nbreak", "e"}, "printable ASCII"},
		{"promote", three["promote"], []any{"0x10"}, "limit must be"},
		{"promote", three["promote"], []any{"1e3"}, "limit must be"},
		{"promote", three["promote"], []any{"10.0"}, "limit must be"},
		{"reclaim", three["reclaim"], []any{"workers", "c2", "inf", "10", "5"}, "min_idle"},
		{"reclaim", three["reclaim"], []any{"workers", "c2", "0", "10", "inf"}, "max_deliveries"},
		{"reclaim", three["reclaim"], []any{"workers", "c2", "-1", "10", "5"}, "min_idle"},
		{"reclaim", three["reclaim"], []any{"workers", "c2", "0", "0x10", "5"}, "count"},
		{"reclaim", three["reclaim"], []any{"workers", "", "0", "10", "5"}, "consumer must not be empty"},
		{"replay", three["replay"], []any{"10", "", "-", "1e3"}, "scan"},
		{"replay", three["replay"], []any{"10", "", "-", "15.5"}, "scan"},
		{"replay", three["replay"], []any{"0x10", "", "-", "100"}, "limit"},
		{"replay", three["replay"], []any{"10", "", "5000", "100"}, "cursor"},
		{"replay", three["replay"], []any{"10", "", "+", "100"}, "cursor"},
		{"replay", three["replay"], []any{"10", "", "(5000", "100"}, "cursor"},
		{"replay", three["replay"], []any{"10", "", "(5000-0", "100"}, "cursor"},
		{"replay", three["replay"], []any{"10", "", "(5000-0..+", "100"}, "cursor"},
		{"replay", three["replay"], []any{"10", "", "(5000-0..6000", "100"}, "cursor"},
		{"replay", three["replay"], []any{"10", "permanent error", "-", "100"}, "reason"},
	} {
		mustRefuse(t, ctx, rdb, c.script, c.want, func() error { return script(t, c.script).Run(ctx, rdb, c.keys, c.args...).Err() })
	}
	for _, id := range badIDs {
		mustRefuse(t, ctx, rdb, "ack", "full stream id", func() error { _, err := q.Ack(ctx, id); return err })
		mustRefuse(t, ctx, rdb, "retry", "full stream id", func() error { _, _, err := q.Retry(ctx, id, 0, "transient", "e"); return err })
		mustRefuse(t, ctx, rdb, "dead_letter", "full stream id", func() error { _, err := q.DeadLetter(ctx, id, "permanent_error", "e"); return err })
	}
	// The entry is still pending, and its full id acks it.
	if ok, err := q.Ack(ctx, "5000-1"); !ok || err != nil {
		t.Fatalf("ack 5000-1: %v %v", ok, err)
	}
	if c := counters(t, ctx, q); c["attempts:success"] != 1 {
		t.Fatalf("attempts:success = %d, want 1", c["attempts:success"])
	}
}

// xrange reads entries with their fields in order, duplicates included
// (go-redis' XMessage keeps one value per name).
func xrange(t testing.TB, ctx context.Context, rdb *redis.Client, key string) [][]string {
	t.Helper()
	v, err := rdb.Do(ctx, "XRANGE", key, "-", "+").Slice()
	if err != nil {
		t.Fatal(err)
	}
	var out [][]string
	for _, e := range v {
		e := e.([]any)
		row := []string{e[0].(string)}
		for _, f := range e[1].([]any) {
			row = append(row, f.(string))
		}
		out = append(out, row)
	}
	return out
}

// fieldsOf maps a dead letter's fields (the last of a name wins).
func fieldsOf(row []string) map[string]string {
	m := map[string]string{}
	for i := 1; i+1 < len(row); i += 2 {
		m[row[i]] = row[i+1]
	}
	return m
}

// Issue 15, item 4: an entry with no id and 4,000 other fields made
// dead_letter and reclaim fail with "too many results to unpack" (XADD's
// arguments come from the Lua stack); as a crash loop it failed every
// reclaim, so no crashed consumer's entry was ever reclaimed again. Such an
// entry is dead-lettered whole now, and an entry the DLQ refuses is skipped
// (reported, counted) while the rest of the batch goes on.
func TestOversizedEntriesDoNotBlockTheQueue(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	wide := make([]string, 0, 8000)
	for i := range 4000 {
		wide = append(wide, fmt.Sprintf("f%d", i), fmt.Sprintf("v%d\x00\xff", i))
	}
	// A malformed attempt: a plain entry's fields are its payload.
	malformedWide := append([]string{"attempt", "zz"}, wide...)

	t.Run("reclaim", func(t *testing.T) {
		q := redisqueue.New(rdb, "wide-reclaim")
		big := pendingRaw(t, ctx, rdb, q, malformedWide...)
		crashed := pendingEntry(t, ctx, rdb, q, "crashed") // another consumer's entry, behind it
		r, err := q.Reclaim(ctx, "c2", 0, 10, 1)
		if err != nil || r.DeadLettered != 2 || len(r.Skipped) != 0 {
			t.Fatalf("reclaim: %+v %v", r, err)
		}
		dl := xrange(t, ctx, rdb, q.Keys().DLQ)
		if len(dl) != 2 || fieldsOf(dl[1])["source_id"] != crashed {
			t.Fatalf("dead letters: %d", len(dl))
		}
		f := fieldsOf(dl[0])
		var kept []string
		if err := json.Unmarshal([]byte(f["entry_fields"]), &kept); err != nil {
			t.Fatalf("entry_fields: %v", err)
		}
		// JSON strings hold text: compare what encoding/json read with
		// what it reads from the original bytes.
		want, _ := json.Marshal(wide)
		var wantKept []string
		json.Unmarshal(want, &wantKept)
		if f["reason"] != "crash_loop" || f["source_id"] != big || fmt.Sprint(kept) != fmt.Sprint(wantKept) {
			t.Fatalf("the wide dead letter lost fields: reason %q source %q, %d of %d values", f["reason"], f["source_id"], len(kept), len(wide))
		}
		if c := counters(t, ctx, q); c["dead_letters:crash_loop"] != 2 || c["attempts:dead_letter"] != 2 {
			t.Fatalf("counters %v", c)
		}
	})

	t.Run("dead_letter", func(t *testing.T) {
		q := redisqueue.New(rdb, "wide-dl")
		big := pendingRaw(t, ctx, rdb, q, malformedWide...)
		if id, err := q.DeadLetter(ctx, big, "malformed", "no id"); id == "" || err != nil {
			t.Fatalf("dead letter: %q %v", id, err)
		}
		// Byte for byte, through Redis' own decoder.
		src := `local f = {} for i, e in ipairs(redis.call('XRANGE', KEYS[1], '-', '+')) do
			for j = 1, #e[2], 2 do if e[2][j] == 'entry_fields' then return cjson.decode(e[2][j + 1]) end end end`
		got, err := rdb.Eval(ctx, src, []string{q.Keys().DLQ}).StringSlice()
		if err != nil || strings.Join(got, "|") != strings.Join(wide, "|") {
			t.Fatalf("entry_fields decoded to %d values (%v), want the %d of the entry", len(got), err, len(wide))
		}
	})

	// A plain entry that wide runs, its fields its payload (the fields
	// JSON): nothing is left over for entry_fields.
	t.Run("plain", func(t *testing.T) {
		q := redisqueue.New(rdb, "wide-plain")
		big := pendingRaw(t, ctx, rdb, q, wide...)
		if id, err := q.DeadLetter(ctx, big, "permanent_error", "e"); id == "" || err != nil {
			t.Fatalf("dead letter: %q %v", id, err)
		}
		f := fieldsOf(xrange(t, ctx, rdb, q.Keys().DLQ)[0])
		if f["id"] != big || f["attempt"] != "1" || f["entry_fields"] != "" || !strings.HasPrefix(f["payload"], `{"f0":"v0\u0000`) {
			t.Fatalf("dead letter: id %q attempt %q payload %.40q", f["id"], f["attempt"], f["payload"])
		}
		var payload map[string]string
		if err := json.Unmarshal([]byte(f["payload"]), &payload); err != nil || len(payload) != 4000 {
			t.Fatalf("payload: %d fields, %v", len(payload), err)
		}
	})

	// Every field is kept, a name given twice too (the last one is the
	// job's, as the workers read it; the others go under entry.).
	t.Run("duplicate names", func(t *testing.T) {
		q := redisqueue.New(rdb, "dup")
		eid := pendingRaw(t, ctx, rdb, q, "id", "first", "payload", "p1", "id", "second", "x", "1", "x", "2", "attempt", "1")
		if _, err := q.DeadLetter(ctx, eid, "permanent_error", "e"); err != nil {
			t.Fatal(err)
		}
		row := xrange(t, ctx, rdb, q.Keys().DLQ)[0]
		got := strings.Join(row[1:], " ")
		for _, want := range []string{"id second", "payload p1", "attempt 1", "entry.id first", "entry.x 1 entry.x 2"} {
			if !strings.Contains(got, want) {
				t.Errorf("dead letter %q lacks %q", got, want)
			}
		}
	})

	t.Run("a dlq that refuses", func(t *testing.T) {
		q := redisqueue.New(rdb, "refusing-dlq")
		loop := pendingEntry(t, ctx, rdb, q, "loop")
		redeliver(t, ctx, rdb, q, loop)                    // delivery 2
		crashed := pendingEntry(t, ctx, rdb, q, "crashed") // delivery 1
		rdb.Set(ctx, q.Keys().DLQ, "legacy", 0)
		r, err := q.Reclaim(ctx, "c3", 0, 10, 2)
		if err != nil || r.DeadLettered != 0 || len(r.Jobs) != 1 || r.Jobs[0].EntryID != crashed ||
			len(r.Skipped) != 1 || r.Skipped[0].EntryID != loop || !strings.Contains(r.Skipped[0].Reason, "is a string, not a stream") {
			t.Fatalf("reclaim: %+v %v", r, err)
		}
		// The crash loop stays pending, its delivery count as it was.
		p, _ := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: q.Keys().Jobs, Group: q.Group(), Start: loop, End: loop, Count: 1}).Result()
		if len(p) != 1 || p[0].RetryCount != 2 {
			t.Fatalf("the skipped entry: %+v", p)
		}
		if c, _ := rdb.HGetAll(ctx, q.Keys().Stats).Result(); c["reclaim_skipped"] != "1" || c["reclaimed"] != "1" || c["attempts:dead_letter"] != "" {
			t.Fatalf("counters %v", c)
		}
		// Once the DLQ can take it, it goes.
		rdb.Del(ctx, q.Keys().DLQ)
		if r, err := q.Reclaim(ctx, "c4", 0, 10, 2); err != nil || r.DeadLettered != 2 {
			t.Fatalf("reclaim after the fix: %+v %v", r, err)
		}
	})
}

// Issue 15, item 6: promote rewrote members it did not write: a JSON
// object payload became "table: 0x...", a large number 1.2345678901235e+19,
// prev_delay_ms 1e300 -9223372036854775808. A member now moves as a job
// only when nothing of it can be lost, else raw, byte for byte.
func TestPromoteNeverRewritesAMemberLossily(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	const base = `"id":"j","attempt":2,"first_enqueued_ms":"1700000000000"`
	raw := []string{
		`{` + base + `,"payload":{"a":1}}`,
		`{` + base + `,"payload":["a"]}`,
		`{` + base + `,"payload":12345678901234567890}`,
		`{"id":"j","attempt":2,"first_enqueued_ms":12345678901234567890,"payload":"p"}`,
		`{` + base + `,"payload":"p","prev_delay_ms":1e300}`,
		`{` + base + `,"payload":"p","prev_delay_ms":-1}`,
		`{"id":"j","attempt":2.0000000000000001,"first_enqueued_ms":"1","payload":"p"}`,
		`{"id":"j","attempt":1e1,"first_enqueued_ms":"1","payload":"p"}`,
		`{"id":"j","attempt":0x10,"first_enqueued_ms":"1","payload":"p"}`,
		`{"id":"j","attempt":007,"first_enqueued_ms":"1","payload":"p"}`,
		`{"id":"j","attempt":1234567890123456,"first_enqueued_ms":"1","payload":"p"}`,
		`{"id":"j","attempt":true,"first_enqueued_ms":"1","payload":"p"}`,
		`{"id":"j","attempt":null,"first_enqueued_ms":"1","payload":"p"}`,
		`{"id":7,"attempt":2,"first_enqueued_ms":"1","payload":"p"}`,
		`{"id":"j","id":"k","attempt":2,"first_enqueued_ms":"1","payload":"p"}`,
		`{` + base + `,"payload":"p","extra":"x"}`,
		`{` + base + `,"payload":"p","last_error":{"nested":{"deep":[1,2,3]}}}`,
		`{"id":""}`, `{}`, `[1,2]`, `"j"`, `not json`, `{"id":"\ud800"}`,
	}
	exact := []struct {
		member string
		want   map[string]string
	}{
		{`{"id":"j","attempt":2,"first_enqueued_ms":"1","payload":"p\u0000\u00e9\"\\/","prev_delay_ms":25}`,
			map[string]string{"id": "j", "attempt": "2", "first_enqueued_ms": "1", "payload": "p\x00é\"\\/", "last_error": "", "last_reason": "", "prev_delay_ms": "25"}},
		// Strings move byte for byte: a worker calls a bad attempt malformed
		// and dead-letters it as it is.
		{`{"id":"j","attempt":"2.5","first_enqueued_ms":1700000000000,"payload":"{\"a\":1}","last_error":"e","last_reason":"transient","source":"1-1"}`,
			map[string]string{"id": "j", "attempt": "2.5", "first_enqueued_ms": "1700000000000", "payload": `{"a":1}`, "last_error": "e", "last_reason": "transient", "prev_delay_ms": "0"}},
		{` { "id" : "j" , "attempt" : 99999999999999 , "prev_delay_ms" : 100000000000000 } `,
			map[string]string{"id": "j", "attempt": "99999999999999", "first_enqueued_ms": "", "payload": "", "last_error": "", "last_reason": "", "prev_delay_ms": "100000000000000"}},
	}
	q := redisqueue.New(rdb, "members")
	q.EnsureGroup(ctx)
	for i, m := range raw {
		rdb.ZAdd(ctx, q.Keys().Delayed, redis.Z{Score: float64(i), Member: m})
	}
	for i, e := range exact {
		rdb.ZAdd(ctx, q.Keys().Delayed, redis.Z{Score: float64(len(raw) + i), Member: e.member})
	}
	n, _, err := q.Promote(ctx, 100)
	if err != nil || n != len(raw)+len(exact) {
		t.Fatalf("promote: %d %v", n, err)
	}
	rows := xrange(t, ctx, rdb, q.Keys().Jobs)
	for i, m := range raw {
		if got := rows[i][1:]; len(got) != 2 || got[0] != "malformed_delayed_member" || got[1] != m {
			t.Errorf("member %s reached the stream as %q, want it raw", m, got)
		}
	}
	for i, e := range exact {
		// The job carries its due time (the member's score): due_ms.
		e.want["due_ms"] = strconv.Itoa(len(raw) + i)
		if got := fieldsOf(rows[len(raw)+i]); !maps.Equal(got, e.want) || len(rows[len(raw)+i]) != 17 {
			t.Errorf("member %s reached the stream as %q, want %q", e.member, got, e.want)
		}
	}
	// A score that is not a whole number of ms in 0..10^15-1 gives no due_ms
	// (the job moves all the same).
	for _, score := range []float64{math.Inf(-1), -1, 1.5} {
		rdb.ZAdd(ctx, q.Keys().Delayed, redis.Z{Score: score, Member: exact[0].member})
		if n, _, err := q.Promote(ctx, 100); err != nil || n != 1 {
			t.Fatalf("promote score %v: %d %v", score, n, err)
		}
		rows := xrange(t, ctx, rdb, q.Keys().Jobs)
		if got := fieldsOf(rows[len(rows)-1]); got["due_ms"] != "" || got["id"] != "j" {
			t.Errorf("score %v: the job reached the stream as %q, want it without due_ms", score, got)
		}
	}
}

// The helpers the scripts share live once, in lib.lua, which every host
// sends before each script: lib.lua defines local functions only (nothing
// runs when the body starts), no script defines one of them again (nor a
// local of the same name, which would shadow it), and each script's body,
// lib.lua and the script, compiles in Redis (SCRIPT LOAD parses without
// running).
func TestScriptHelpersLiveInLib(t *testing.T) {
	lib, err := contract.Scripts.ReadFile("scripts/lib.lua")
	if err != nil {
		t.Fatal(err)
	}
	helpers := map[string]bool{}
	for i, line := range strings.Split(strings.TrimSuffix(string(lib), "\n"), "\n") {
		switch {
		case strings.HasPrefix(line, "local function "):
			name := strings.TrimPrefix(line[:strings.Index(line, "(")], "local function ")
			if name == "refuse" {
				t.Errorf("lib.lua:%d: refuse names its script: it stays in each script", i+1)
			}
			helpers[name] = true
		case line == "end", strings.HasPrefix(line, "--"), strings.HasPrefix(line, "  "):
		default:
			t.Errorf("lib.lua:%d: only local functions and comments at the top level, got %q", i+1, line)
		}
	}
	if len(helpers) < 15 {
		t.Fatalf("lib.lua defines only %d helpers: %v", len(helpers), helpers)
	}
	files, err := contract.Scripts.ReadDir("scripts")
	if err != nil {
		t.Fatal(err)
	}
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	scripts := 0
	for _, f := range files {
		name := strings.TrimSuffix(f.Name(), ".lua")
		if name == "lib" {
			continue
		}
		scripts++
		src, err := contract.Scripts.ReadFile("scripts/" + f.Name())
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(src), "\n") {
			code, _, _ := strings.Cut(line, "--")
			code = strings.TrimSpace(code)
			var names []string
			if fn, ok := strings.CutPrefix(code, "local function "); ok {
				names = []string{strings.TrimSpace(strings.Split(fn, "(")[0])}
			} else if vars, ok := strings.CutPrefix(code, "local "); ok {
				vars, _, _ = strings.Cut(vars, "=")
				names = strings.Split(vars, ",")
			}
			for _, v := range names {
				if v = strings.TrimSpace(v); helpers[v] {
					t.Errorf("%s:%d defines %s, which lib.lua defines: %q", f.Name(), i+1, v, line)
				}
			}
		}
		body, err := contract.ScriptSource(name)
		if err != nil {
			t.Fatal(err)
		}
		if want := string(lib) + "\n" + string(src); body != want {
			t.Errorf("ScriptSource(%q) is not lib.lua, a newline and %s.lua", name, name)
		}
		if err := rdb.ScriptLoad(ctx, body).Err(); err != nil {
			t.Errorf("%s: lib.lua and the script do not compile: %v", name, err)
		}
	}
	if scripts != 12 {
		t.Errorf("found %d scripts beside lib.lua, want 12", scripts)
	}
	if _, err := contract.ScriptSource("lib"); err == nil {
		t.Error(`ScriptSource("lib") gave a body: lib.lua is no script`)
	}
}
