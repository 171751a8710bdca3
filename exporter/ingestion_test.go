package exporter

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// DLQIngestion gives the scrape's backstop_dlq_ingested_total and
// backstop_dlq_size, queue by queue: the alerter and the collector read the
// DLQ alike. A queue whose DLQ does not exist yet has ingested 0.
func TestDLQIngestionIsTheScrapeFigure(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	for range 3 {
		must(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: redisqueue.KeysFor("orders").DLQ, Values: []any{"reason", "permanent_error"}}).Err())
	}
	must(t, rdb.XTrimMaxLen(ctx, redisqueue.KeysFor("orders").DLQ, 1).Err()) // ingestion survives trimming
	c, _ := newTestCollector(t, rdb, WithQueues(QueueFor("orders"), QueueFor("emails")))

	ins, err := c.DLQIngestion(ctx)
	if err != nil {
		t.Fatal(err)
	}
	scrape := gather(t, c)
	if len(ins) != 2 {
		t.Fatalf("got %+v, want emails and orders", ins)
	}
	for _, in := range ins {
		if in.Err != nil || !in.Known {
			t.Fatalf("%s: %+v", in.Queue, in)
		}
		if want := scrape[`backstop_dlq_ingested_total{queue="`+in.Queue+`"}`]; float64(in.Ingested) != want {
			t.Errorf("%s: ingested %d, the scrape says %v", in.Queue, in.Ingested, want)
		}
		if want := scrape[`backstop_dlq_size{queue="`+in.Queue+`"}`]; float64(in.Size) != want {
			t.Errorf("%s: size %d, the scrape says %v", in.Queue, in.Size, want)
		}
	}
	if ins[0].Queue != "emails" || ins[0].Ingested != 0 || ins[1].Queue != "orders" || ins[1].Ingested != 3 || ins[1].Size != 1 {
		t.Errorf("got %+v, want emails 0 and orders 3 (1 left after trimming)", ins)
	}
}
