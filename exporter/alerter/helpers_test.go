package alerter

import (
	"context"
	"log/slog"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/exporter"
	"github.com/backstop-dev/backstop/internal/testing/logbuf"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// newTestAlerter returns an alerter of the queues orders and emails over
// rdb, posting to amURL, with a logger into the returned buffer.
func newTestAlerter(t *testing.T, rdb redis.UniversalClient, amURL string, opts ...Option) (*Alerter, *logbuf.Buffer) {
	t.Helper()
	c := newTestCollector(t, rdb, exporter.QueueFor("orders"), exporter.QueueFor("emails"))
	logs := &logbuf.Buffer{}
	opts = append([]Option{WithLogger(slog.New(slog.NewTextHandler(logs, nil)))}, opts...)
	a, err := New(c, amURL, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return a, logs
}

func newTestCollector(t *testing.T, rdb redis.UniversalClient, qs ...exporter.Queue) *exporter.Collector {
	t.Helper()
	c, err := exporter.NewCollector(rdb, exporter.WithQueues(qs...))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func addDeadLetter(t *testing.T, rdb redis.UniversalClient, name string) {
	t.Helper()
	must(t, rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: redisqueue.KeysFor(name).DLQ, Values: []any{"reason", "permanent_error"}}).Err())
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

func deadLetter(t *testing.T, q *redisqueue.Queue, id, reason string) {
	t.Helper()
	if v, err := q.DeadLetter(context.Background(), id, reason, "boom"); err != nil || v == "" {
		t.Fatalf("dead-letter %s: %q %v", id, v, err)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
