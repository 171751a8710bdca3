package exporter

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/redistest"
	"github.com/backstop-dev/backstop/queue"
)

func TestHashTag(t *testing.T) {
	for key, want := range map[string]string{
		"{orders}:jobs": "orders", "x{a}{b}": "a", "{}:jobs": "", "jobs:main": "", "{open": "", "a{b}c}": "b",
	} {
		got, ok := hashTag(key)
		if got != want || ok != (want != "") {
			t.Errorf("hashTag(%q) = %q, %v; want %q", key, got, ok, want)
		}
	}
}

// addQueue creates the jobs stream and group of queue name.
func addQueue(t *testing.T, rdb redis.UniversalClient, name string) {
	t.Helper()
	must(t, rdb.XGroupCreateMkStream(context.Background(), queue.KeysFor(name).Jobs, "workers", "0").Err())
}

// TestDiscovery finds queues by pattern, keeps a configured queue's own
// layout, caches the names between refreshes and refreshes them.
func TestDiscovery(t *testing.T) {
	rdb := redistest.Start(t).Client()
	for _, n := range []string{"a", "b", "c"} {
		addQueue(t, rdb, n)
	}
	must(t, rdb.Set(context.Background(), "{x}:other", "1", 0).Err()) // does not match
	custom := Queue{Name: "a", Keys: queue.Keys{Jobs: queue.KeysFor("a").Jobs}, Groups: []string{"audit"}}

	c, _ := newTestCollector(t, rdb, WithQueues(custom), WithPattern("{*}:jobs", time.Hour, 100))
	got := gather(t, c)
	want(t, got, map[string]float64{
		"backstop_queues": 3, `backstop_stream_pending_jobs{group="workers",queue="b"}`: 0,
		`backstop_dlq_size{queue="c"}`: 0,
	}, `backstop_dlq_size{queue="a"}`, `backstop_stream_pending_jobs{group="workers",queue="a"}`, `backstop_dlq_size{queue="x"}`)

	addQueue(t, rdb, "d")
	want(t, gather(t, c), map[string]float64{"backstop_queues": 3}) // cached for an hour

	c, _ = newTestCollector(t, rdb, WithPattern("{*}:jobs", time.Millisecond, 100))
	want(t, gather(t, c), map[string]float64{"backstop_queues": 4})
	addQueue(t, rdb, "e")
	// Refreshes run in the background: the new queue shows within a few scrapes.
	deadline := time.Now().Add(10 * time.Second)
	for gather(t, c)["backstop_queues"] != 5 {
		if time.Now().After(deadline) {
			t.Fatal("queue e never discovered")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestDiscoveryBounded stops at max keys and says so in the log.
func TestDiscoveryBounded(t *testing.T) {
	rdb := redistest.Start(t).Client()
	for _, n := range []string{"a", "b", "c", "d", "e"} {
		addQueue(t, rdb, n)
	}
	c, logs := newTestCollector(t, rdb, WithPattern("{*}:jobs", time.Hour, 2))
	want(t, gather(t, c), map[string]float64{"backstop_queues": 2, "backstop_up": 1})
	if !strings.Contains(logs.String(), `msg="queue discovery stopped at max keys"`) {
		t.Errorf("no log line for the bound:\n%s", logs)
	}
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
	deadline := time.Now().Add(10 * time.Second)
	for gather(t, c)["backstop_queues"] != 1 {
		if time.Now().After(deadline) {
			t.Fatal("discovery did not recover")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
