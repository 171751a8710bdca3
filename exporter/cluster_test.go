package exporter

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/resp"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// TestCluster runs queues through the scripts on a 3-master Redis Cluster
// and discovers them by SCAN on every master: one pipeline, split per
// master over the collector's own connections, reads them all; and the
// same through the client's pipelines (go-redis splits them).
func TestCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	rdb := cluster.Client(t)
	ctx := context.Background()
	const n = 20
	for i := range n {
		q := redisqueue.New(rdb, "q"+strconv.Itoa(i))
		must(t, q.EnsureGroup(ctx))
		for j := range 3 {
			_, err := q.Enqueue(ctx, "job-"+strconv.Itoa(j), nil)
			must(t, err)
		}
		m := readGroup(t, rdb, q.Keys().Jobs, "workers", 3)
		ack(t, q, m[0].ID)
		deadLetter(t, q, m[1].ID, "permanent_error")
	}
	// The queues really are spread: every master holds some.
	must(t, rdb.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		if size := node.DBSize(ctx).Val(); size == 0 {
			t.Errorf("master %s holds no key", node.Options().Addr)
		}
		return nil
	}))

	c, logs := newTestCollector(t, rdb, WithPattern("{*}:jobs", time.Hour, 1000))
	if _, ok := transportOf(c).(*resp.ClusterTransport); !ok {
		t.Fatalf("transport %T, want a connection of the collector's own per master", transportOf(c))
	}
	got := gather(t, c)
	want(t, got, map[string]float64{"backstop_up": 1, "backstop_scrape_partial": 0, "backstop_queues": n})
	// Every master's memory and refusals, by its address.
	for _, addr := range cluster.Addrs {
		want(t, got, map[string]float64{
			`backstop_redis_memory_max_bytes{node="` + addr + `"}`:                   0,
			`backstop_redis_rejected_writes_total{node="` + addr + `",reason="oom"}`: 0,
		})
	}
	for i := range n {
		q := strconv.Quote("q" + strconv.Itoa(i))
		want(t, got, map[string]float64{
			`backstop_enqueued_total{queue=` + q + `}`:                                          3,
			`backstop_dlq_size{queue=` + q + `}`:                                                1,
			`backstop_stream_pending_jobs{group="workers",queue=` + q + `}`:                     1,
			`backstop_attempts_total{job_type="",outcome="success",queue=` + q + `}`:            1,
			`backstop_dead_letters_total{job_type="",queue=` + q + `,reason="permanent_error"}`: 1,
		})
	}
	if logs.String() != "" {
		t.Errorf("unexpected logs:\n%s", logs)
	}
	via, _ := newTestCollector(t, rdb, WithClientPipelines(), WithPattern("{*}:jobs", time.Hour, 1000))
	viaGot := gather(t, via)
	for k, v := range got {
		if k != "backstop_scrape_duration_seconds" && !strings.HasPrefix(k, "backstop_redis_memory_used_bytes") && viaGot[k] != v {
			t.Errorf("%s: %v through the client's pipelines, %v over the own connections", k, viaGot[k], v)
		}
	}
	if len(got) != len(viaGot) {
		t.Errorf("%d series through the client's pipelines, %d over the own connections", len(viaGot), len(got))
	}
}

// TestClusterSlotMoving moves a queue's slot to another master under a
// running collector, as redis-cli --cluster reshard does: while the keys
// are migrated the old master answers ASK, once the slot is moved MOVED.
// The collector follows both, as go-redis did, and the queue is reported
// whole, without an error, before, during and after.
func TestClusterSlotMoving(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	rdb := cluster.Client(t)
	ctx := context.Background()
	q := redisqueue.New(rdb, "moving")
	must(t, q.EnsureGroup(ctx))
	for j := range 3 {
		_, err := q.Enqueue(ctx, "job-"+strconv.Itoa(j), nil)
		must(t, err)
	}
	m := readGroup(t, rdb, q.Keys().Jobs, "workers", 1)
	deadLetter(t, q, m[0].ID, "permanent_error")

	c, logs := newTestCollector(t, rdb, WithQueues(QueueFor("moving")))
	whole := map[string]float64{
		"backstop_up": 1, "backstop_scrape_partial": 0, `backstop_scrape_errors_total{kind="reply"}`: 0,
		`backstop_enqueued_total{queue="moving"}`: 3, `backstop_dlq_size{queue="moving"}`: 1,
	}
	want(t, gather(t, c), whole)

	slot, err := rdb.ClusterKeySlot(ctx, q.Keys().Jobs).Result()
	must(t, err)
	source, err := rdb.MasterForKey(ctx, q.Keys().Jobs)
	must(t, err)
	var target *redis.Client
	for _, addr := range cluster.Addrs {
		if addr != source.Options().Addr {
			target = redis.NewClient(&redis.Options{Addr: addr})
			t.Cleanup(func() { target.Close() })
			break
		}
	}
	sourceID, err := source.Do(ctx, "CLUSTER", "MYID").Text()
	must(t, err)
	targetID, err := target.Do(ctx, "CLUSTER", "MYID").Text()
	must(t, err)
	must(t, target.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", sourceID).Err())
	must(t, source.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", targetID).Err())
	keys, err := source.ClusterGetKeysInSlot(ctx, int(slot), 100).Result()
	must(t, err)
	if len(keys) < 3 {
		t.Fatalf("keys in slot %d: %v", slot, keys)
	}
	host, port, _ := net.SplitHostPort(target.Options().Addr)
	migrate := append([]any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}, anyArgs(keys)...)
	must(t, source.Do(ctx, migrate...).Err())
	if err := source.Do(ctx, "XLEN", q.Keys().Jobs).Err(); err == nil || !strings.HasPrefix(err.Error(), "ASK ") {
		t.Fatalf("the source master answers %v, want ASK", err)
	}
	want(t, gather(t, c), whole) // every key answered through ASK

	must(t, rdb.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		return node.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", targetID).Err()
	}))
	if err := source.Do(ctx, "XLEN", q.Keys().Jobs).Err(); err == nil || !strings.HasPrefix(err.Error(), "MOVED ") {
		t.Fatalf("the source master answers %v, want MOVED", err)
	}
	want(t, gather(t, c), whole) // through MOVED
	want(t, gather(t, c), whole) // the slot map reloaded
	if logs.String() != "" {
		t.Errorf("unexpected logs:\n%s", logs)
	}
}

// anyArgs is a command's arguments as go-redis's Do takes them.
func anyArgs(args []string) []any {
	a := make([]any, len(args))
	for i, s := range args {
		a[i] = s
	}
	return a
}
