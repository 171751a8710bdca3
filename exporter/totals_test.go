package exporter

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// Totals gives, queue by queue, the scrape's backstop_retries_total summed
// over reasons and job types and its backstop_dlq_ingested_total: the
// console's history and Prometheus read the same figures. A queue that
// never ran a job has retried nothing.
func TestTotalsAreTheScrapeFigures(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	keys := redisqueue.KeysFor("orders")
	must(t, rdb.HSet(ctx, keys.Stats, "retries:transient", 4, "retries:retry_after", 2, "t:email:retries:transient", 1,
		"attempts:retry", 6, "attempts:dead_letter", 2).Err())
	for range 2 {
		must(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: keys.DLQ, Values: []any{"reason", "permanent_error"}}).Err())
	}
	c, _ := newTestCollector(t, rdb, WithQueues(QueueFor("orders"), QueueFor("emails")))

	ts, err := c.Totals(ctx)
	if err != nil {
		t.Fatal(err)
	}
	scrape := gather(t, c)
	if len(ts) != 2 || ts[0].Queue != "emails" || ts[1].Queue != "orders" {
		t.Fatalf("got %+v, want emails and orders", ts)
	}
	for _, tot := range ts {
		if tot.Err != nil || !tot.RetriesKnown || !tot.IngestedKnown || tot.RetriesUpperBound {
			t.Fatalf("%s: %+v", tot.Queue, tot)
		}
		var retries float64
		for k, v := range scrape {
			if strings.HasPrefix(k, "backstop_retries_total{") && strings.Contains(k, `queue="`+tot.Queue+`"`) {
				retries += v
			}
		}
		if float64(tot.Retries) != retries {
			t.Errorf("%s: retries %d, the scrape says %v", tot.Queue, tot.Retries, retries)
		}
		if want := scrape[`backstop_dlq_ingested_total{queue="`+tot.Queue+`"}`]; float64(tot.Ingested) != want {
			t.Errorf("%s: ingested %d, the scrape says %v", tot.Queue, tot.Ingested, want)
		}
	}
	if ts[0].Retries != 0 || ts[0].Ingested != 0 || ts[1].Retries != 6 || ts[1].Ingested != 2 {
		t.Errorf("got %+v, want emails 0/0 and orders 6 retries (the per-type ones counted once), 2 ingested", ts)
	}

	// A stats hash of the wrong type is the queue's error, not the other's.
	must(t, rdb.Del(ctx, keys.Stats).Err())
	must(t, rdb.Set(ctx, keys.Stats, "x", 0).Err())
	ts, err = c.Totals(ctx)
	if err != nil || ts[1].Err == nil || ts[1].RetriesKnown || ts[0].Err != nil || !ts[0].RetriesKnown {
		t.Errorf("wrong-type stats hash: got %+v, %v; want orders' error alone", ts, err)
	}
}
