package exporter

import (
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/resp"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
)

// TestUnknownIsNotZero reads replies as servers without Redis 7's stream
// counters send them: a field left out or NULL is unknown, never 0.
func TestUnknownIsNotZero(t *testing.T) {
	dlq := func(info any, scripts any) dlqFigures {
		t.Helper()
		r := &dlqRead{p: pipeOf(info), info: 0, scripts: noRef, stats: noRef}
		if scripts != nil {
			if scripts == redis.Nil {
				scripts = nil
			}
			r.p, r.scripts = pipeOf(info, scripts), 1
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

	groups, err := groupInfo(pipeOf([]any{
		[]any{"name", "redis6", "consumers", int64(1), "pending", int64(2), "last-delivered-id", "5-0"},
		map[any]any{"name": "unknown", "pending": int64(2), "last-delivered-id": "5-0", "entries-read": int64(4), "lag": nil},
		map[any]any{"name": "embedded", "pending": int64(2), "last-delivered-id": "5-0", "entries-read": nil, "lag": int64(7)},
		map[any]any{"name": "unread", "pending": int64(0), "last-delivered-id": "0-0", "entries-read": nil, "lag": int64(7)},
		map[any]any{"name": "counted", "pending": int64(2), "last-delivered-id": "5-0", "entries-read": int64(4), "lag": int64(1)},
	}).Reply(0))
	must(t, err)
	for name, want := range map[string]group{
		"redis6": {pending: 2}, "unknown": {pending: 2}, "embedded": {pending: 2},
		"unread": {lag: 7, lagKnown: true}, "counted": {pending: 2, lag: 1, lagKnown: true},
	} {
		if got := groups[name]; got.pending != want.pending || got.lagKnown != want.lagKnown || (want.lagKnown && got.lag != want.lag) {
			t.Errorf("group %s: %+v, want %+v", name, got, want)
		}
	}
	if _, err := groupInfo(pipeOf([]any{map[any]any{"pending": int64(1)}}).Reply(0)); kindOf(err) != kindReply {
		t.Errorf("a group without a name: %v (kind %s), want a reply error", err, kindOf(err))
	}
}

// pipeOf is a pipe whose commands' replies are the values given, as
// go-redis decodes them (strings, int64, []any, map[any]any, errors).
func pipeOf(values ...any) *resp.Pipe {
	r := &resp.Replies{}
	for _, v := range values {
		r.Append(v)
	}
	return resp.NewPipe(nil, r)
}

// TestTransportsAgree scrapes over the collector's own connection and
// over the client's pipelines in RESP2 and RESP3: the replies, read raw
// in either form, give the same figures.
func TestTransportsAgree(t *testing.T) {
	srv := redistest.Start(t)
	prepareOrders(t, srv.Client())
	scrape := func(protocol int, opts ...Option) map[string]float64 {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Protocol: protocol})
		t.Cleanup(func() { rdb.Close() })
		c, _ := newTestCollector(t, rdb, append(opts, WithQueues(QueueFor("orders")))...)
		if _, own := transportOf(c).(*resp.ConnTransport); own == (len(opts) > 0) {
			t.Fatalf("transport %T with options %d", transportOf(c), len(opts))
		}
		got := gather(t, c)
		for k := range got {
			if k == "backstop_scrape_duration_seconds" || strings.HasPrefix(k, "backstop_redis_memory_used_bytes") {
				delete(got, k) // differ between any two scrapes
			}
		}
		return got
	}
	own := scrape(3)
	want(t, own, map[string]float64{
		`backstop_dlq_ingested_total{queue="orders"}`:              2,
		`backstop_stream_lag_jobs{group="workers",queue="orders"}`: 1,
		`backstop_delayed_queue_size{queue="orders"}`:              2,
	})
	for name, got := range map[string]map[string]float64{
		"client pipelines, RESP2": scrape(2, WithClientPipelines()),
		"client pipelines, RESP3": scrape(3, WithClientPipelines()),
	} {
		for k, v := range got {
			if own[k] != v {
				t.Errorf("%s: %s: %v, own connection %v", name, k, v, own[k])
			}
		}
		if len(own) != len(got) {
			t.Errorf("%s: %d series, own connection %d", name, len(got), len(own))
		}
	}
}
