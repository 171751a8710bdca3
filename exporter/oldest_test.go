package exporter

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/testing/redistest"
)

// TestOldestJobAge reports the age of the older of the jobs stream's first
// entry and the delayed set's next member, from first_enqueued_ms (a
// retried job keeps it through the delayed set and back): the stream's
// head, the delayed head, an entry without the field (its id's time), a
// member that does not say (skipped), and an empty queue (0).
func TestOldestJobAge(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	now := clock.UnixMilli()
	add := func(q Queue, id string, fields ...string) {
		must(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: q.Keys.Jobs, ID: id, Values: fields}).Err())
	}
	zadd := func(q Queue, due int64, member string) {
		must(t, rdb.ZAdd(ctx, q.Keys.Delayed, redis.Z{Score: float64(due), Member: member}).Err())
	}
	// stream: a retried job (enqueued 90 s ago) ahead of a fresh one.
	stream := QueueFor("stream")
	add(stream, "1700000090000-1", "id", "r", "attempt", "2", "first_enqueued_ms", "1700000010000")
	add(stream, "1700000095000-1", "id", "f", "attempt", "1", "first_enqueued_ms", "1700000095000")
	zadd(stream, now+60000, `{"id":"d","attempt":2,"first_enqueued_ms":"1700000050000"}`)
	// delayed: the next member due was enqueued 3600 s ago; the stream's
	// entry has no first_enqueued_ms (40 s by its id).
	delayed := QueueFor("delayed")
	add(delayed, "1700000060000-0", "id", "x")
	zadd(delayed, now-1000, `{"id":"old","attempt":3,"first_enqueued_ms":"1699996500000"}`)
	zadd(delayed, now+1000, `{"id":"older","attempt":3,"first_enqueued_ms":1600000000000}`) // not at the head: not seen
	// garbage: a member that does not say, and no stream.
	garbage := QueueFor("garbage")
	zadd(garbage, now, "not json")
	empty := QueueFor("empty")

	c, logs := newTestCollector(t, rdb, WithQueues(stream, delayed, garbage, empty))
	want(t, gather(t, c), map[string]float64{
		`backstop_oldest_job_age_seconds{queue="stream"}`:  90,
		`backstop_oldest_job_age_seconds{queue="delayed"}`: 3600,
		`backstop_oldest_job_age_seconds{queue="garbage"}`: 0,
		`backstop_oldest_job_age_seconds{queue="empty"}`:   0,
	})
	if got := withoutNotFound(logs.String(), "empty"); got != "" {
		t.Errorf("unexpected log lines:\n%s", got)
	}
}
