package exporter

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/testing/redistest"
)

// TestRedisRefusesWrites puts Redis over maxmemory with noeviction, the
// state in which it refuses acks and retries: the exporter, which never
// writes, shows the refusals (INFO errorstats) and the memory against its
// limit, and stays up.
func TestRedisRefusesWrites(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	c, logs := newTestCollector(t, rdb, WithQueues(QueueFor("orders")))
	node := `node="` + srv.Addr + `"`
	want(t, gather(t, c), map[string]float64{
		"backstop_up": 1,
		`backstop_redis_memory_max_bytes{` + node + `}`:                          0,
		`backstop_redis_memory_policy_info{` + node + `,policy="noeviction"}`:    1,
		`backstop_redis_rejected_writes_total{` + node + `,reason="oom"}`:        0,
		`backstop_redis_rejected_writes_total{` + node + `,reason="misconf"}`:    0,
		`backstop_redis_rejected_writes_total{` + node + `,reason="readonly"}`:   0,
		`backstop_redis_rejected_writes_total{` + node + `,reason="noreplicas"}`: 0,
		`backstop_redis_evicted_keys_total{` + node + `}`:                        0,
		`backstop_scrape_errors_total{kind="reply"}`:                             0,
	})

	must(t, rdb.ConfigSet(ctx, "maxmemory", "1").Err()) // anything is over it
	for _, err := range []error{
		rdb.Set(ctx, "{orders}:x", "1", 0).Err(),
		rdb.XAdd(ctx, &redis.XAddArgs{Stream: "{orders}:jobs", Values: []string{"id", "1"}}).Err(),
	} {
		if err == nil || !strings.HasPrefix(err.Error(), "OOM") {
			t.Fatalf("write under maxmemory: %v, want OOM", err)
		}
	}
	got := gather(t, c)
	want(t, got, map[string]float64{
		"backstop_up": 1, "backstop_scrape_partial": 0,
		`backstop_redis_memory_max_bytes{` + node + `}`:                   1,
		`backstop_redis_rejected_writes_total{` + node + `,reason="oom"}`: 2,
	})
	if used := got[`backstop_redis_memory_used_bytes{`+node+`}`]; used < 1e5 {
		t.Errorf("used memory %v", used)
	}
	if got := withoutNotFound(logs.String(), "orders"); got != "" { // nothing could be written
		t.Errorf("unexpected logs:\n%s", got)
	}
}

// TestRedisEvicts runs Redis at its limit with an evicting policy: queue
// keys are lost, and the exporter shows the evictions.
func TestRedisEvicts(t *testing.T) {
	srv := redistest.Start(t, "--maxmemory-policy", "allkeys-lru")
	rdb := srv.Client()
	ctx := context.Background()
	used, err := rdb.Info(ctx, "memory").Result()
	must(t, err)
	limit, err := strconv.Atoi(parseInfo(used)["used_memory"])
	must(t, err)
	must(t, rdb.ConfigSet(ctx, "maxmemory", strconv.Itoa(limit+1<<20)).Err()) // room for about 10 of the keys below
	big := strings.Repeat("x", 100<<10)
	for i := range 30 {
		must(t, rdb.Set(ctx, "{q}:k"+string(rune('a'+i)), big, 0).Err())
	}
	c, _ := newTestCollector(t, rdb, WithQueues(QueueFor("q")))
	got := gather(t, c)
	node := `node="` + srv.Addr + `"`
	if got[`backstop_redis_evicted_keys_total{`+node+`}`] < 1 {
		t.Errorf("no eviction reported: %v", got[`backstop_redis_evicted_keys_total{`+node+`}`])
	}
	want(t, got, map[string]float64{`backstop_redis_memory_policy_info{` + node + `,policy="allkeys-lru"}`: 1})
}

// TestRedisReplicaRefuses points the exporter at a replica, where writes
// fail with READONLY.
func TestRedisReplicaRefuses(t *testing.T) {
	master := redistest.Start(t)
	replica := redistest.Start(t)
	rdb := replica.Client()
	ctx := context.Background()
	host, port, _ := strings.Cut(master.Addr, ":")
	must(t, rdb.SlaveOf(ctx, host, port).Err())
	writer := redis.NewClient(&redis.Options{Addr: replica.Addr, MaxRetries: -1}) // go-redis retries READONLY
	t.Cleanup(func() { writer.Close() })
	if err := writer.Set(ctx, "k", "v", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "READONLY") {
		t.Fatalf("write to a replica: %v, want READONLY", err)
	}
	c, _ := newTestCollector(t, rdb, WithQueues(QueueFor("q")))
	want(t, gather(t, c), map[string]float64{
		`backstop_redis_rejected_writes_total{node="` + replica.Addr + `",reason="readonly"}`: 1,
	})
}

// TestNodeReport reads every refusal of INFO errorstats, and leaves out
// what INFO does not say: no errorstats section, no refusal counts (a
// section without lines is no refusal yet).
func TestNodeReport(t *testing.T) {
	info := "# Memory\r\nused_memory:1024\r\nmaxmemory:2048\r\nmaxmemory_policy:noeviction\r\n# Stats\r\nevicted_keys:0\r\n" +
		"# Errorstats\r\nerrorstat_ERR:count=9\r\nerrorstat_MISCONF:count=4\r\nerrorstat_NOREPLICAS:count=5\r\nerrorstat_OOM:count=7\r\nerrorstat_READONLY:count=1\r\n"
	s := &sink{kinds: map[string]error{}}
	(&node{name: "n:1", info: parseInfo(info)}).report(s)
	(&node{name: "bad\xff", info: parseInfo("used_memory:x\r\n# Errorstats\r\n")}).report(s)
	(&node{name: "old:1", info: parseInfo("# Memory\r\nused_memory:5\r\n")}).report(s)
	got := gather(t, replay{&s.samples})
	want(t, got, map[string]float64{
		`backstop_redis_memory_used_bytes{node="n:1"}`:                         1024,
		`backstop_redis_memory_max_bytes{node="n:1"}`:                          2048,
		`backstop_redis_rejected_writes_total{node="n:1",reason="oom"}`:        7,
		`backstop_redis_rejected_writes_total{node="n:1",reason="misconf"}`:    4,
		`backstop_redis_rejected_writes_total{node="n:1",reason="noreplicas"}`: 5,
		`backstop_redis_rejected_writes_total{node="n:1",reason="readonly"}`:   1,
		`backstop_redis_rejected_writes_total{node="unknown",reason="oom"}`:    0,
		`backstop_redis_memory_used_bytes{node="old:1"}`:                       5,
	}, `backstop_redis_memory_used_bytes{node="unknown"}`, `backstop_redis_memory_policy_info{node="unknown",policy=""}`,
		`backstop_redis_rejected_writes_total{node="old:1",reason="oom"}`)
}
