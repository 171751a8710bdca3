package main

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// embeddedDifferences are the differences `backstop demo -h` lists, each
// with a probe that reports whether a server shows it. The probes get a
// fresh server each.
var embeddedDifferences = []struct {
	help  string // the line of demoEmbeddedHelp that names it
	probe func(t *testing.T, rdb *redis.Client) bool
}{
	{"DLQ ingestion", func(t *testing.T, rdb *redis.Client) bool {
		ctx := context.Background()
		noErr(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: "s", Values: []string{"a", "b"}}).Err())
		v, err := rdb.Do(ctx, "XINFO", "STREAM", "s").Result()
		noErr(t, err)
		_, ok := fields(t, v)["entries-added"]
		return !ok
	}},
	{"stream lag", func(t *testing.T, rdb *redis.Client) bool {
		// Two entries, one delivered: the lag is 1.
		ctx := context.Background()
		q := newQueue(t, rdb, "a", "b")
		deliver(t, rdb, q, 1)
		v, err := rdb.Do(ctx, "XINFO", "GROUPS", q.Keys().Jobs).Result()
		noErr(t, err)
		g := fields(t, v.([]any)[0])
		return g["entries-read"] == nil && g["lag"] == int64(2)
	}},
	{"pending", func(t *testing.T, rdb *redis.Client) bool {
		ctx := context.Background()
		q := newQueue(t, rdb, "a", "b")
		ids := deliver(t, rdb, q, 2)
		noErr(t, rdb.XDel(ctx, q.Keys().Jobs, ids[1]).Err())
		groups, err := rdb.XInfoGroups(ctx, q.Keys().Jobs).Result()
		noErr(t, err)
		return groups[0].Pending != 2
	}},
	{"node figures", func(t *testing.T, rdb *redis.Client) bool {
		ctx := context.Background()
		infoErr := rdb.Info(ctx, "memory", "stats", "errorstats").Err()
		clientErr := rdb.ClientInfo(ctx).Err()
		if (infoErr == nil) != (clientErr == nil) {
			t.Errorf("INFO: %v; CLIENT INFO: %v", infoErr, clientErr)
		}
		return infoErr != nil
	}},
	{"deliveries", func(t *testing.T, rdb *redis.Client) bool {
		q := newQueue(t, rdb, "a")
		ids := deliver(t, rdb, q, 1)
		held, err := q.Hold(context.Background(), "c", ids[0])
		if err != nil || !held[0] {
			t.Fatalf("hold: %v %v", held, err)
		}
		return pendingEntries(t, rdb, q)[0].RetryCount != 1
	}},
	{"deleted entries", func(t *testing.T, rdb *redis.Client) bool {
		q := newQueue(t, rdb, "a")
		ids := deliver(t, rdb, q, 1)
		noErr(t, rdb.XDel(context.Background(), q.Keys().Jobs, ids[0]).Err())
		held, err := q.Hold(context.Background(), "c", ids[0])
		if err != nil || held[0] {
			t.Fatalf("hold of a deleted entry: %v %v", held, err)
		}
		return len(pendingEntries(t, rdb, q)) != 0
	}},
	{"payloads", func(t *testing.T, rdb *redis.Client) bool {
		// A payload that is not UTF-8 through retry (cjson.encode) and
		// promote (cjson.decode).
		ctx := context.Background()
		q := newQueue(t, rdb)
		payload := "\xff\xfe<&>"
		_, err := q.Enqueue(ctx, "j", []byte(payload))
		noErr(t, err)
		ids := deliver(t, rdb, q, 1)
		if _, ok, err := q.Retry(ctx, ids[0], 0, "transient", "503"); err != nil || !ok {
			t.Fatalf("retry: %v %v", ok, err)
		}
		if n, _, err := q.Promote(ctx, 10); err != nil || n != 1 {
			t.Fatalf("promote: %d %v", n, err)
		}
		res, err := rdb.XRange(ctx, q.Keys().Jobs, "-", "+").Result()
		noErr(t, err)
		return res[0].Values["payload"] != payload
	}},
}

// TestEmbeddedServerDifferences keeps `backstop demo -h` true: each
// difference it lists shows on the embedded server and not on
// redis-server, and what it says is the same is the same on both.
func TestEmbeddedServerDifferences(t *testing.T) {
	embedded := func(t *testing.T) *redis.Client {
		rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
		t.Cleanup(func() { rdb.Close() })
		return rdb
	}
	for _, d := range embeddedDifferences {
		if !strings.Contains(demoEmbeddedHelp, "\n  "+d.help+" ") {
			t.Errorf("demo -h does not list %q", d.help)
		}
		if d.probe(t, redistest.Start(t).Client()) {
			t.Errorf("%s: redis-server shows it: not a difference", d.help)
		}
		if !d.probe(t, embedded(t)) {
			t.Errorf("%s: the embedded server does not show it (fixed upstream?): take it out of demo -h", d.help)
		}
	}
	if n := len(regexp.MustCompile(`\n  [A-Za-z]`).FindAllString(demoEmbeddedHelp, -1)); n != len(embeddedDifferences) {
		t.Errorf("demo -h lists %d differences, the test checks %d", n, len(embeddedDifferences))
	}
	for name, rdb := range map[string]*redis.Client{"redis-server": redistest.Start(t).Client(), "embedded": embedded(t)} {
		same(t, name, rdb)
	}
}

// same checks, on one server, what demo -h says is the same on both.
func same(t *testing.T, name string, rdb *redis.Client) {
	ctx := context.Background()
	eval := func(src string, keys ...string) []any {
		t.Helper()
		v, err := rdb.Eval(ctx, src, keys).Slice()
		if err != nil {
			t.Fatalf("%s: %s: %v", name, src, err)
		}
		return v
	}
	// TIME: seconds and microseconds, as the scripts read them.
	if v := eval(`local t = redis.call('TIME'); return {t[1], t[2], string.format('%d', t[1] * 1000 + math.floor(t[2] / 1000))}`); len(v[2].(string)) != 13 {
		t.Errorf("%s: TIME in ms: %v", name, v)
	}
	// redis.pcall gives an error as a table with err; TYPE a status with ok.
	noErr(t, rdb.HSet(ctx, "h", "f", "x").Err())
	v := eval(`local r = redis.pcall('HINCRBY', KEYS[1], 'f', 1); return {type(r), tostring(r.err), redis.call('TYPE', KEYS[1]).ok}`, "h")
	if v[0] != "table" || !strings.HasPrefix(v[1].(string), "ERR ") || v[2] != "hash" {
		t.Errorf("%s: pcall and TYPE: %v", name, v)
	}
	// cjson.decode reads whole numbers of 15 digits exactly (promote.lua).
	if v := eval(`local j = cjson.decode('{"n":123456789012345}'); return {type(j.n), string.format('%d', j.n)}`); v[1] != "123456789012345" {
		t.Errorf("%s: cjson.decode: %v", name, v)
	}
	// XPENDING: delivery counts, and IDLE leaves out an entry just read.
	q := newQueue(t, rdb, "a")
	deliver(t, rdb, q, 1)
	if r, err := q.Reclaim(ctx, "w", time.Hour, 10, 5); err != nil || len(r.Jobs) != 0 {
		t.Errorf("%s: reclaim of entries idle for an hour: %+v %v", name, r, err)
	}
	if r, err := q.Reclaim(ctx, "w", 0, 10, 5); err != nil || len(r.Jobs) != 1 || pendingEntries(t, rdb, q)[0].RetryCount != 2 {
		t.Errorf("%s: reclaim: %+v %v, want the entry claimed, delivered twice", name, r, err)
	}
}

// newQueue returns queue "q" with its group and the jobs ids enqueued.
func newQueue(t *testing.T, rdb *redis.Client, ids ...string) *redisqueue.Queue {
	t.Helper()
	q := redisqueue.New(rdb, "q")
	noErr(t, q.EnsureGroup(context.Background()))
	for _, id := range ids {
		_, err := q.Enqueue(context.Background(), id, nil)
		noErr(t, err)
	}
	return q
}

// deliver reads n entries of q for consumer c and returns their ids.
func deliver(t *testing.T, rdb *redis.Client, q *redisqueue.Queue, n int64) []string {
	t.Helper()
	res, err := rdb.XReadGroup(context.Background(), &redis.XReadGroupArgs{Group: q.Group(), Consumer: "c", Streams: []string{q.Keys().Jobs, ">"}, Count: n, Block: -1}).Result()
	noErr(t, err)
	var ids []string
	for _, m := range res[0].Messages {
		ids = append(ids, m.ID)
	}
	if int64(len(ids)) != n {
		t.Fatalf("read %d entries, want %d", len(ids), n)
	}
	return ids
}

func pendingEntries(t *testing.T, rdb *redis.Client, q *redisqueue.Queue) []redis.XPendingExt {
	t.Helper()
	p, err := rdb.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: q.Keys().Jobs, Group: q.Group(), Start: "-", End: "+", Count: 10}).Result()
	noErr(t, err)
	return p
}

// fields reads an XINFO reply (a RESP3 map).
func fields(t *testing.T, v any) map[string]any {
	t.Helper()
	m, ok := v.(map[any]any)
	if !ok {
		t.Fatalf("XINFO reply %T, want a map", v)
	}
	out := map[string]any{}
	for k, val := range m {
		out[k.(string)] = val
	}
	return out
}

func noErr(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
