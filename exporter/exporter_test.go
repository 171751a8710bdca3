package exporter

import (
	"context"
	"flag"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

var update = flag.Bool("update", false, "rewrite testdata/golden.prom from the current output")

// golden lists the metrics compared to testdata/golden.prom: all but the
// scrape duration, the build info and the Redis node's metrics, which vary
// by run, toolchain and port (TestRedisNode checks those).
var golden = []string{
	"backstop_up", "backstop_scrape_partial", "backstop_scrape_errors_total", "backstop_queues",
	"backstop_scrape_limit_reached",
	"backstop_delayed_queue_size", "backstop_delayed_overdue_jobs", "backstop_delayed_oldest_overdue_seconds",
	"backstop_dlq_size", "backstop_dlq_ingested_total",
	"backstop_stream_pending_jobs", "backstop_stream_lag_jobs", "backstop_stream_oldest_pending_seconds",
	"backstop_stream_pending_deliveries",
	"backstop_attempts_total", "backstop_retries_total", "backstop_dead_letters_total", "backstop_deferrals_total",
	"backstop_max_attempts_reached_total", "backstop_job_attempts",
	"backstop_enqueued_total", "backstop_promoted_total", "backstop_reclaimed_total", "backstop_reclaim_skipped_total",
	"backstop_replayed_total", "backstop_dlq_discarded_total", "backstop_force_run_total", "backstop_oldest_job_age_seconds",
	"backstop_queue_found",
}

// TestGolden scrapes a prepared set of queues with known contents and
// compares the whole exposition to testdata/golden.prom:
//
//   - orders: driven through the queue scripts (enqueue, ack, retry,
//     promote, dead-letter, replay, defer);
//   - legacy: an existing layout (jobs:main, delayed:retries, jobs:dlq)
//     written by hand, with no stats hash, three pending entries with known
//     delivery counts, a trimmed DLQ, a group that never read (audit) and
//     one that does not exist (ghost);
//   - lagless: a deletion ahead of the group, so Redis reports lag NULL;
//   - fresh: no key at all (backstop_queue_found 0, and a warning).
func TestGolden(t *testing.T) {
	rdb := redistest.Start(t).Client()
	prepareOrders(t, rdb)
	prepareLegacy(t, rdb)
	prepareLagless(t, rdb)
	qs, err := LoadQueuesConfig("testdata/queues.yaml")
	must(t, err)
	c, logs := newTestCollector(t, rdb, WithQueues(qs...))

	if *update {
		out, err := testutil.CollectAndFormat(c, expfmt.TypeTextPlain, golden...)
		must(t, err)
		must(t, os.WriteFile("testdata/golden.prom", out, 0o644))
	}
	f, err := os.Open("testdata/golden.prom")
	must(t, err)
	defer f.Close()
	if err := testutil.CollectAndCompare(c, f, golden...); err != nil {
		t.Error(err)
	}
	// Two scrapes (CollectAndCompare's, and CollectAndFormat's with
	// -update), one warning: a queue not found is logged once.
	if want := `level=WARN msg="queue not found: none of its keys exists; check its name (--queues, --queues.config)" queue=fresh`; strings.Count(logs.String(), "\n") != 1 || !strings.Contains(logs.String(), want) {
		t.Errorf("log lines:\n%s\nwant one: %s", logs, want)
	}
}

// prepareOrders drives queue orders through the scripts.
func prepareOrders(t *testing.T, rdb redis.UniversalClient) {
	ctx := context.Background()
	q := redisqueue.New(rdb, "orders")
	must(t, q.EnsureGroup(ctx))
	for i := range 6 {
		_, err := q.Enqueue(ctx, "job-"+strconv.Itoa(i), []byte("payload"))
		must(t, err)
	}
	m := readGroup(t, rdb, q.Keys().Jobs, "workers", 6)
	ack(t, q, m[0].ID)
	ack(t, q, m[1].ID)
	retry(t, q, m[2].ID, 0, "transient")
	retry(t, q, m[3].ID, 0, "retry_after")
	retry(t, q, m[4].ID, time.Hour, "transient") // stays delayed, not due
	deadLetter(t, q, m[5].ID, "permanent_error")
	if n, _, err := q.Promote(ctx, 10); err != nil || n != 2 {
		t.Fatalf("promote: %d, %v", n, err)
	}
	m = readGroup(t, rdb, q.Keys().Jobs, "workers", 2) // attempt 2
	ack(t, q, m[0].ID)
	deadLetter(t, q, m[1].ID, "max_attempts_reached")
	// A job meets an open breaker: deferred, not a retry.
	_, err := q.Enqueue(ctx, "job-6", []byte("payload"))
	must(t, err)
	m = readGroup(t, rdb, q.Keys().Jobs, "workers", 1)
	if _, ok, err := q.Defer(ctx, m[0].ID, time.Hour, "circuit_open", ""); err != nil || !ok {
		t.Fatalf("defer: %v, %v", ok, err)
	}
	if n, err := q.Replay(ctx, 1, ""); err != nil || n != 1 {
		t.Fatalf("replay: %d, %v", n, err)
	}
}

// prepareLegacy writes an existing layout by hand, ids and scores at fixed
// times around the test clock.
func prepareLegacy(t *testing.T, rdb redis.UniversalClient) {
	ctx := context.Background()
	for i := 1; i <= 5; i++ {
		must(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: "jobs:main", ID: "1700000000000-" + strconv.Itoa(i), Values: []string{"id", "j" + strconv.Itoa(i)}}).Err())
	}
	must(t, rdb.XGroupCreate(ctx, "jobs:main", "workers", "0").Err())
	must(t, rdb.XGroupCreate(ctx, "jobs:main", "audit", "0").Err())
	readGroup(t, rdb, "jobs:main", "workers", 3)
	// Delivered 12, 4 and 1 times: XCLAIM's RETRYCOUNT sets the count.
	must(t, rdb.Do(ctx, "XCLAIM", "jobs:main", "workers", "c", 0, "1700000000000-1", "RETRYCOUNT", 12).Err())
	must(t, rdb.Do(ctx, "XCLAIM", "jobs:main", "workers", "c", 0, "1700000000000-2", "RETRYCOUNT", 4).Err())
	now := clock.UnixMilli()
	must(t, rdb.ZAdd(ctx, "delayed:retries",
		redis.Z{Score: float64(now - 30000), Member: "a"}, // overdue by 30 s
		redis.Z{Score: float64(now - 5000), Member: "b"},
		redis.Z{Score: float64(now + 60000), Member: "c"}).Err())
	for i := 1; i <= 2; i++ {
		must(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: "jobs:dlq", ID: "1700000000000-" + strconv.Itoa(i), Values: []string{"reason", "x"}}).Err())
	}
	must(t, rdb.XTrimMaxLen(ctx, "jobs:dlq", 1).Err()) // size 1, ingested 2
}

// prepareLagless leaves a deleted entry ahead of the group's last delivered
// id: Redis 7 can no longer count the lag and reports it NULL.
func prepareLagless(t *testing.T, rdb redis.UniversalClient) {
	ctx := context.Background()
	key := redisqueue.KeysFor("lagless").Jobs
	for i := 1; i <= 4; i++ {
		must(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: key, ID: "1700000000000-" + strconv.Itoa(i), Values: []string{"id", "j"}}).Err())
	}
	must(t, rdb.XGroupCreate(ctx, key, "workers", "0").Err())
	readGroup(t, rdb, key, "workers", 1)
	must(t, rdb.XDel(ctx, key, "1700000000000-3").Err())
	groups, err := rdb.XInfoGroups(ctx, key).Result()
	must(t, err)
	if groups[0].Lag != -1 {
		t.Fatalf("lag of %s = %d, want NULL (-1): check the Redis version's semantics", key, groups[0].Lag)
	}
}

func readGroup(t *testing.T, rdb redis.UniversalClient, key, group string, n int64) []redis.XMessage {
	t.Helper()
	res, err := rdb.XReadGroup(context.Background(), &redis.XReadGroupArgs{Group: group, Consumer: "c", Streams: []string{key, ">"}, Count: n, Block: -1}).Result()
	must(t, err)
	if len(res[0].Messages) != int(n) {
		t.Fatalf("read %d entries of %s, want %d", len(res[0].Messages), key, n)
	}
	return res[0].Messages
}

func ack(t *testing.T, q *redisqueue.Queue, id string) {
	t.Helper()
	if ok, err := q.Ack(context.Background(), id); err != nil || !ok {
		t.Fatalf("ack %s: %v %v", id, ok, err)
	}
}

func retry(t *testing.T, q *redisqueue.Queue, id string, d time.Duration, reason string) {
	t.Helper()
	if _, ok, err := q.Retry(context.Background(), id, d, reason, "boom"); err != nil || !ok {
		t.Fatalf("retry %s: %v %v", id, ok, err)
	}
}

func deadLetter(t *testing.T, q *redisqueue.Queue, id, reason string) {
	t.Helper()
	if v, err := q.DeadLetter(context.Background(), id, reason, "boom"); err != nil || v == "" {
		t.Fatalf("dead-letter %s: %q %v", id, v, err)
	}
}
