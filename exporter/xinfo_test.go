package exporter

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/redistest"
)

// TestUnknownIsNotZero reads replies as servers without Redis 7's stream
// counters send them: a field left out or NULL is unknown, never 0.
func TestUnknownIsNotZero(t *testing.T) {
	ctx := context.Background()
	dlq := func(info any, scripts any) dlqFigures {
		t.Helper()
		r := &dlqRead{info: redis.NewCmd(ctx)}
		r.info.SetVal(info)
		if scripts != nil {
			r.scripts = redis.NewStringCmd(ctx)
			switch v := scripts.(type) {
			case string:
				r.scripts.SetVal(v)
			case error:
				r.scripts.SetErr(v)
			}
		}
		f, err := r.result()
		must(t, err)
		return f
	}
	redis6 := []any{"length", int64(3), "radix-tree-keys", int64(1), "last-generated-id", "5-0"} // RESP2, no entries-added
	for _, c := range []struct {
		name string
		got  dlqFigures
		want dlqFigures
	}{
		{"redis 7", dlq(map[any]any{"length": int64(3), "entries-added": int64(9)}, "4"), dlqFigures{size: 3, ingested: 9, known: true}},
		{"redis 6, scripts count", dlq(redis6, "5"), dlqFigures{size: 3, ingested: 5, known: true}},
		{"redis 6, fewer than the stream holds", dlq(redis6, "2"), dlqFigures{size: 3}},
		{"redis 6, no count", dlq(redis6, redis.Nil), dlqFigures{size: 3}},
		{"redis 6, empty, no count", dlq([]any{"length", int64(0)}, redis.Nil), dlqFigures{known: true}},
		{"redis 6, stats unreadable", dlq(redis6, redis.Error(badReply("WRONGTYPE"))), dlqFigures{size: 3}},
		{"redis 6, no stats hash", dlq(redis6, nil), dlqFigures{size: 3}},
	} {
		if c.got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, c.got, c.want)
		}
	}

	groups, err := groupInfo([]any{
		[]any{"name", "redis6", "consumers", int64(1), "pending", int64(2), "last-delivered-id", "5-0"},
		map[any]any{"name": "unknown", "pending": int64(2), "last-delivered-id": "5-0", "entries-read": int64(4), "lag": nil},
		map[any]any{"name": "embedded", "pending": int64(2), "last-delivered-id": "5-0", "entries-read": nil, "lag": int64(7)},
		map[any]any{"name": "unread", "pending": int64(0), "last-delivered-id": "0-0", "entries-read": nil, "lag": int64(7)},
		map[any]any{"name": "counted", "pending": int64(2), "last-delivered-id": "5-0", "entries-read": int64(4), "lag": int64(1)},
	})
	must(t, err)
	for name, want := range map[string]group{
		"redis6": {pending: 2}, "unknown": {pending: 2}, "embedded": {pending: 2},
		"unread": {lag: 7, lagKnown: true}, "counted": {pending: 2, lag: 1, lagKnown: true},
	} {
		if got := groups[name]; got.pending != want.pending || got.lagKnown != want.lagKnown || (want.lagKnown && got.lag != want.lag) {
			t.Errorf("group %s: %+v, want %+v", name, got, want)
		}
	}
	if _, err := groupInfo([]any{map[any]any{"pending": int64(1)}}); kindOf(err) != kindReply {
		t.Errorf("a group without a name: %v (kind %s), want a reply error", err, kindOf(err))
	}
}

// TestRESP2AndRESP3Agree scrapes over a RESP2 and a RESP3 client: the XINFO
// replies read raw give the same figures in both forms.
func TestRESP2AndRESP3Agree(t *testing.T) {
	srv := redistest.Start(t)
	prepareOrders(t, srv.Client())
	scrape := func(protocol int) map[string]float64 {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Protocol: protocol})
		t.Cleanup(func() { rdb.Close() })
		c, _ := newTestCollector(t, rdb, WithQueues(QueueFor("orders")))
		got := gather(t, c)
		for k := range got {
			if k == "backstop_scrape_duration_seconds" || strings.HasPrefix(k, "backstop_redis_memory_used_bytes") {
				delete(got, k) // differ between any two scrapes
			}
		}
		return got
	}
	resp2, resp3 := scrape(2), scrape(3)
	want(t, resp2, map[string]float64{
		`backstop_dlq_ingested_total{queue="orders"}`:              2,
		`backstop_stream_lag_jobs{group="workers",queue="orders"}`: 1,
	})
	for k, v := range resp3 {
		if resp2[k] != v {
			t.Errorf("%s: %v over RESP3, %v over RESP2", k, v, resp2[k])
		}
	}
	if len(resp2) != len(resp3) {
		t.Errorf("%d series over RESP2, %d over RESP3", len(resp2), len(resp3))
	}
}
