package exporter

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// TestQueueOfKey maps a key to its queue only when the key is exactly a
// key of the default layout of its hash tag, as Redis Cluster reads the
// tag (from the first '{' to the first '}' after it), and the name can be
// a label value.
func TestQueueOfKey(t *testing.T) {
	for key, want := range map[string]string{
		"{orders}:jobs": "orders", "{orders}:delayed": "orders", "{orders}:dlq": "orders", "{orders}:stats": "orders",
		"{a:b}:jobs":        "a:b", // a colon in the tag is part of the name: {a:b}:jobs is KeysFor("a:b").Jobs
		"{a{b}:jobs":        "a{b",
		"{ünï}:jobs":        "ünï",
		"{brace}x}:jobs":    "", // tag brace, but {brace}:jobs is another key: no phantom queue brace
		"{}:jobs":           "", // no tag: Redis hashes the whole key
		"{}x}:jobs":         "",
		"{orders}:jobs:old": "", "{orders}:lock": "", "{orders}": "", "{orders}:": "",
		"x{orders}:jobs": "", "app:{orders}:jobs": "", // custom layouts: give them with --queues.config
		"jobs:main": "", "{open": "", "": "",
		"{bad\xff}:jobs": "", "{new\nline}:jobs": "", "{nul\x00}:jobs": "", "{tab\t}:jobs": "",
	} {
		got, ok := queueOfKey(key)
		if got != want || ok != (want != "") {
			t.Errorf("queueOfKey(%q) = %q, %v; want %q", key, got, ok, want)
		}
	}
}

// addQueue creates the jobs stream and group of queue name.
func addQueue(t *testing.T, rdb redis.UniversalClient, name string) {
	t.Helper()
	must(t, rdb.XGroupCreateMkStream(context.Background(), redisqueue.KeysFor(name).Jobs, "workers", "0").Err())
}

// TestDiscovery finds queues by pattern, keeps a configured queue's own
// layout, caches the names between refreshes and refreshes them.
func TestDiscovery(t *testing.T) {
	rdb := redistest.Start(t).Client()
	for _, n := range []string{"a", "b", "c"} {
		addQueue(t, rdb, n)
	}
	must(t, rdb.Set(context.Background(), "{x}:other", "1", 0).Err()) // does not match
	custom := Queue{Name: "a", Keys: redisqueue.Keys{Jobs: redisqueue.KeysFor("a").Jobs}, Groups: []string{"audit"}}

	c, _ := newTestCollector(t, rdb, WithQueues(custom), WithPattern("{*}:jobs", time.Hour, 100))
	got := gather(t, c)
	want(t, got, map[string]float64{
		"backstop_queues": 3, `backstop_stream_pending_jobs{group="workers",queue="b"}`: 0,
		`backstop_dlq_size{queue="c"}`: 0,
		// Not configured for a, but a group of its stream: every group is reported.
		`backstop_stream_pending_jobs{group="workers",queue="a"}`: 0,
	}, `backstop_dlq_size{queue="a"}`, `backstop_dlq_size{queue="x"}`)

	addQueue(t, rdb, "d")
	want(t, gather(t, c), map[string]float64{"backstop_queues": 3}) // cached for an hour

	c, _ = newTestCollector(t, rdb, WithPattern("{*}:jobs", time.Millisecond, 100))
	want(t, gather(t, c), map[string]float64{"backstop_queues": 4})
	addQueue(t, rdb, "e")
	// Refreshes run in the background: the new queue shows within a few scrapes.
	eventually.True(t, 10*time.Second, "queue e to be discovered", func() bool {
		return gather(t, c)["backstop_queues"] == 5
	})
}

// TestDiscoveryExactKeys discovers through a pattern that matches more
// than queue keys: only keys that are exactly a queue's key in the default
// layout name a queue, and the metrics count the others.
func TestDiscoveryExactKeys(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	addQueue(t, rdb, "a")
	addQueue(t, rdb, "a:b")
	must(t, rdb.ZAdd(ctx, "{a}:delayed", redis.Z{Score: 1, Member: "x"}).Err()) // a second key of queue a
	for _, key := range []string{"{brace}x}:jobs", "{}:jobs", "{c}:jobs:old", "{c}:lock", "{bad\xff}:jobs", "{new\nline}:jobs"} {
		must(t, rdb.Set(ctx, key, "1", 0).Err())
	}
	c, logs := newTestCollector(t, rdb, WithPattern("{*}:*", time.Hour, 100))
	want(t, gather(t, c), map[string]float64{
		"backstop_queues": 2, `backstop_stream_pending_jobs{group="workers",queue="a:b"}`: 0,
		`backstop_delayed_queue_size{queue="a"}`:          1,
		`backstop_discovery_keys{outcome="queue"}`:        3,
		`backstop_discovery_keys{outcome="skipped"}`:      6,
		`backstop_discovery_keys{outcome="over_limit"}`:   0,
		`backstop_scrape_limit_reached{limit="max_keys"}`: 0,
		"backstop_scrape_partial":                         0,
		`backstop_scrape_errors_total{kind="reply"}`:      0,
		`backstop_scrape_errors_total{kind="wrong_type"}`: 0,
	}, `backstop_dlq_size{queue="brace"}`, `backstop_dlq_size{queue="c"}`, `backstop_dlq_size{queue=""}`)
	if !strings.Contains(logs.String(), `msg="keys matching the queues pattern are not keys of a queue in the default layout"`) {
		t.Errorf("no log line for the skipped keys:\n%s", logs)
	}
}

// TestDiscoveryBounded stops taking keys at max keys, and says so in the
// metrics: the scrape is partial, the limit is reached, and the keys left
// out are counted.
func TestDiscoveryBounded(t *testing.T) {
	rdb := redistest.Start(t).Client()
	for _, n := range []string{"a", "b", "c", "d", "e"} {
		addQueue(t, rdb, n)
	}
	c, logs := newTestCollector(t, rdb, WithPattern("{*}:jobs", time.Hour, 2))
	want(t, gather(t, c), map[string]float64{
		"backstop_queues": 2, "backstop_up": 1, "backstop_scrape_partial": 1,
		`backstop_scrape_limit_reached{limit="max_keys"}`: 1,
		`backstop_scrape_limit_reached{limit="timeout"}`:  0,
		`backstop_discovery_keys{outcome="queue"}`:        2,
		`backstop_discovery_keys{outcome="over_limit"}`:   3,
	})
	if !strings.Contains(logs.String(), `msg="queue discovery stopped at max keys"`) {
		t.Errorf("no log line for the bound:\n%s", logs)
	}

	// At the bound exactly, nothing is left out.
	c, _ = newTestCollector(t, rdb, WithPattern("{*}:jobs", time.Hour, 5))
	want(t, gather(t, c), map[string]float64{
		"backstop_queues": 5, "backstop_scrape_partial": 0,
		`backstop_scrape_limit_reached{limit="max_keys"}`: 0,
		`backstop_discovery_keys{outcome="over_limit"}`:   0,
	})
}

// TestDiscoveryRedisDown reports the failed SCAN and retries it.
func TestDiscoveryRedisDown(t *testing.T) {
	srv := redistest.Start(t)
	// Few dial retries: the default ones take seconds per scrape.
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, DialerRetries: 1, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	addQueue(t, rdb, "a")
	srv.Stop()
	c, logs := newTestCollector(t, rdb, WithPattern("{*}:jobs", time.Hour, 100))
	want(t, gather(t, c), map[string]float64{"backstop_up": 0, "backstop_queues": 0, `backstop_scrape_errors_total{kind="connection"}`: 1})
	if !strings.Contains(logs.String(), `msg="queue discovery failed"`) {
		t.Errorf("no log line for the failed discovery:\n%s", logs)
	}
	srv.Restart() // empty: the test server does not persist
	addQueue(t, srv.Client(), "b")
	eventually.True(t, 10*time.Second, "discovery to recover", func() bool {
		return gather(t, c)["backstop_queues"] == 1
	})
}
