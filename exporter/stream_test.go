package exporter

import (
	"context"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/testing/redistest"
)

// TestEveryGroup reports the pending, lag and oldest pending of every
// consumer group of a stream, not only the configured one: here a stream
// read by two groups, neither named workers (the default), one of which
// has delivered entries and one of which has not.
func TestEveryGroup(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	q := QueueFor("billing")
	key := q.Keys.Jobs
	for i := 1; i <= 4; i++ {
		must(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: key, ID: "1700000000000-" + strconv.Itoa(i), Values: []string{"id", "j" + strconv.Itoa(i)}}).Err())
	}
	must(t, rdb.XGroupCreate(ctx, key, "invoicers", "0").Err())
	must(t, rdb.XGroupCreate(ctx, key, "mailers", "0").Err())
	readGroup(t, rdb, key, "invoicers", 3)

	c, logs := newTestCollector(t, rdb, WithQueues(q))
	age := float64(clock.UnixMilli()-1700000000000) / 1000
	want(t, gather(t, c), map[string]float64{
		`backstop_stream_pending_jobs{group="invoicers",queue="billing"}`:             3,
		`backstop_stream_lag_jobs{group="invoicers",queue="billing"}`:                 1,
		`backstop_stream_oldest_pending_seconds{group="invoicers",queue="billing"}`:   age,
		`backstop_stream_pending_deliveries_count{group="invoicers",queue="billing"}`: 3,
		`backstop_stream_pending_jobs{group="mailers",queue="billing"}`:               0,
		`backstop_stream_lag_jobs{group="mailers",queue="billing"}`:                   4,
		`backstop_stream_oldest_pending_seconds{group="mailers",queue="billing"}`:     0,
	}, `backstop_stream_pending_jobs{group="workers",queue="billing"}`)
	if logs.String() != "" {
		t.Errorf("unexpected log lines:\n%s", logs)
	}
}
