package exporter

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/testing/redistest"
)

// perQueue is the Redis work of one scrape for one queue of the default
// layout with one group.
var perQueue = map[string]int64{
	"zcard": 1, "zcount": 1, // delayed set, and its first member (zrange below)
	"xinfo|stream": 1,                // DLQ size and entries-added
	"xinfo|groups": 1, "xpending": 1, // jobs stream groups, bounded sample
	"hgetall": 1,              // stats, and the scripts' dead letters for a server without entries-added
	"xrange":  1, "zrange": 1, // oldest job: the stream's first entry; the delayed set's first member, read once for both
}

// fill writes n queues named prefix+i: entries jobs entries of which
// pending are delivered, 3 delayed jobs, 2 dead letters and a stats hash,
// in pipelines of big batches.
func fill(t testing.TB, rdb redis.UniversalClient, prefix string, n, entries, pending int) []Queue {
	t.Helper()
	ctx := context.Background()
	var qs []Queue
	for i := range n {
		q := QueueFor(prefix + strconv.Itoa(i))
		qs = append(qs, q)
		p := rdb.Pipeline()
		p.XGroupCreateMkStream(ctx, q.Keys.Jobs, "workers", "0")
		for added := 0; added < entries; {
			batch := min(entries-added, 10000)
			for range batch {
				p.XAdd(ctx, &redis.XAddArgs{Stream: q.Keys.Jobs, Values: []string{"id", "j", "attempt", "1"}})
			}
			added += batch
			if _, err := p.Exec(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if pending > 0 {
			p.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "workers", Consumer: "c", Streams: []string{q.Keys.Jobs, ">"}, Count: int64(pending), Block: -1})
		}
		p.ZAdd(ctx, q.Keys.Delayed, redis.Z{Score: 1, Member: "a"}, redis.Z{Score: 2, Member: "b"}, redis.Z{Score: 4e12, Member: "c"})
		p.XAdd(ctx, &redis.XAddArgs{Stream: q.Keys.DLQ, Values: []string{"reason", "permanent_error"}})
		p.XAdd(ctx, &redis.XAddArgs{Stream: q.Keys.DLQ, Values: []string{"reason", "crash_loop"}})
		p.HSet(ctx, q.Keys.Stats, "enqueued", entries, "attempts:success", 5, "attempts:retry", 2,
			"retries:transient", 2, "dead_letters:permanent_error", 1, "finished:success:1", 4, "finished:success:3", 1, "finished_sum:success", 7)
		if _, err := p.Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return qs
}

// TestThousandQueues scrapes 1,000 queues and counts the commands Redis
// ran for it (INFO commandstats): a fixed number per queue in one scrape,
// plus one PING and the node's INFO and CLIENT INFO.
func TestThousandQueues(t *testing.T) {
	srv := redistest.Start(t)
	rdb, admin := srv.Client(), srv.Client()
	qs := fill(t, rdb, "q", 1000, 60, 50)
	c, logs := newTestCollector(t, rdb, WithQueues(qs...))
	gather(t, c) // warm the connection pool: its handshakes are not scrape work
	commandCalls(t, admin)

	got := gather(t, c)
	calls := commandCalls(t, admin)
	for cmd, n := range perQueue {
		if calls[cmd] != n*1000 {
			t.Errorf("%s ran %d times, want %d", cmd, calls[cmd], n*1000)
		}
	}
	// One PING, and CLIENT INFO beside INFO (not counted) for the node label.
	if total(calls) != 8*1000+2 || calls["client|info"] != 1 {
		t.Errorf("scrape ran %d commands, want %d: %v", total(calls), 8*1000+2, calls)
	}
	want(t, got, map[string]float64{
		"backstop_up": 1, "backstop_scrape_partial": 0, "backstop_queues": 1000,
		`backstop_stream_pending_jobs{group="workers",queue="q999"}`: 50,
		`backstop_stream_lag_jobs{group="workers",queue="q999"}`:     10,
		// 1,000 groups share the sample budget: 10 entries each.
		`backstop_stream_pending_deliveries_count{group="workers",queue="q999"}`: 10,
		`backstop_dlq_ingested_total{queue="q0"}`:                                2,
		`backstop_delayed_overdue_jobs{queue="q500"}`:                            2,
		`backstop_job_attempts_count{job_type="",outcome="success",queue="q1"}`:  5,
		// 50 pending, a sample of 10: the deliveries are a sample, and the
		// metrics say so.
		`backstop_scrape_limit_reached{limit="pending_sample"}`: 1,
	})
	if logs.String() != "" {
		t.Errorf("unexpected logs:\n%s", logs)
	}
}

func TestSampleSize(t *testing.T) {
	for groups, want := range map[int]int64{0: 100, 1: 100, 100: 100, 101: 99, 200: 50, 1000: 10, 5000: 10} {
		if got := sampleSize(groups); got != want {
			t.Errorf("sampleSize(%d) = %d, want %d", groups, got, want)
		}
	}
}

// TestFlatInQueueLength scrapes queues of 10 entries, then queues of
// 100,000 entries with 10,000 pending: Redis runs the same commands, and
// the XPENDING sample stays bounded.
func TestFlatInQueueLength(t *testing.T) {
	srv := redistest.Start(t)
	rdb, admin := srv.Client(), srv.Client()
	small := fill(t, rdb, "small", 3, 10, 2)
	large := fill(t, rdb, "large", 3, 100000, 10000)

	count := func(qs []Queue) (map[string]int64, map[string]float64) {
		c, _ := newTestCollector(t, rdb, WithQueues(qs...))
		gather(t, c)
		commandCalls(t, admin)
		got := gather(t, c)
		return commandCalls(t, admin), got
	}
	smallCalls, gotSmall := count(small)
	largeCalls, got := count(large)
	want(t, gotSmall, map[string]float64{`backstop_scrape_limit_reached{limit="pending_sample"}`: 0})
	if len(smallCalls) != len(largeCalls) {
		t.Fatalf("commands differ: %v vs %v", smallCalls, largeCalls)
	}
	for cmd, n := range smallCalls {
		if largeCalls[cmd] != n {
			t.Errorf("%s: %d for short queues, %d for long ones", cmd, n, largeCalls[cmd])
		}
	}
	want(t, got, map[string]float64{
		`backstop_stream_pending_jobs{group="workers",queue="large0"}`:                     10000,
		`backstop_stream_lag_jobs{group="workers",queue="large0"}`:                         90000,
		`backstop_stream_pending_deliveries_count{group="workers",queue="large0"}`:         maxSample,
		`backstop_stream_pending_deliveries_bucket{group="workers",le="1",queue="large0"}`: maxSample,
		`backstop_scrape_limit_reached{limit="pending_sample"}`:                            1,
	})
}

// TestBatches reads more queues than one pipeline takes: Redis runs the
// same commands in two pipelines. When the second one misses the budget,
// the first one's queues are still reported, and the scrape says it is
// partial because of the timeout.
func TestBatches(t *testing.T) {
	srv := redistest.Start(t)
	rdb, admin := srv.Client(), srv.Client()
	qs := fill(t, rdb, "q", batchQueues+10, 1, 0)
	c, _ := newTestCollector(t, rdb, WithQueues(qs...))
	gather(t, c)
	commandCalls(t, admin)
	got := gather(t, c)
	if calls := commandCalls(t, admin); calls["xinfo|stream"] != int64(len(qs)) {
		t.Errorf("read %d DLQs of %d queues", calls["xinfo|stream"], len(qs))
	}
	last := slices.MaxFunc(qs, func(a, b Queue) int { return strings.Compare(a.Name, b.Name) }).Name // queues are read by name: the second pipeline
	lastDLQ := `backstop_dlq_size{queue="` + last + `"}`
	want(t, got, map[string]float64{"backstop_queues": float64(len(qs)), "backstop_scrape_partial": 0, lastDLQ: 2})

	hook := newBlockHook()
	hook.pass.Store(1) // the first pipeline of queues answers, the second is held
	rdb.AddHook(hook)
	t.Cleanup(hook.Release)
	c, _ = newTestCollector(t, rdb, WithClientPipelines(), WithQueues(qs...), WithTimeout(200*time.Millisecond))
	got = gather(t, c)
	want(t, got, map[string]float64{
		"backstop_up": 1, "backstop_scrape_partial": 1, "backstop_queues": float64(len(qs)),
		`backstop_scrape_limit_reached{limit="timeout"}`: 1,
		`backstop_scrape_errors_total{kind="timeout"}`:   1,
		`backstop_dlq_size{queue="q0"}`:                  2,
	}, lastDLQ)
}
