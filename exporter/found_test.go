package exporter

import (
	"context"
	"strings"
	"testing"

	"github.com/backstop-dev/backstop/internal/testing/rabbittest"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// Issue 42: --queues ordrs (a typo) published healthy zeros and logged
// nothing. backstop_queue_found is 0 for it, and the exporter warns once,
// not on every scrape; once the queue has a key it is found, and says so.
func TestQueueNotFoundWarnsOnce(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	q := redisqueue.New(rdb, "orders")
	if _, err := q.Enqueue(ctx, "a", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	c, logs := newTestCollector(t, rdb, WithQueues(QueueFor("orders"), QueueFor("ordrs")))
	for range 3 {
		want(t, gather(t, c), map[string]float64{`backstop_queue_found{queue="orders"}`: 1, `backstop_queue_found{queue="ordrs"}`: 0, "backstop_up": 1})
	}
	if got := logs.String(); strings.Count(got, "queue not found") != 1 || !strings.Contains(got, "level=WARN") || !strings.Contains(got, "queue=ordrs") {
		t.Errorf("logs after 3 scrapes:\n%s\nwant one warning naming ordrs", got)
	}
	if _, err := redisqueue.New(rdb, "ordrs").Enqueue(ctx, "b", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	want(t, gather(t, c), map[string]float64{`backstop_queue_found{queue="ordrs"}`: 1})
	if got := logs.String(); !strings.Contains(got, `msg="queue found" queue=ordrs`) {
		t.Errorf("logs:\n%s\nwant the queue found again", got)
	}
}

// withoutNotFound returns logs without the "queue not found" warning of
// queue q, which a test expects (a queue it left without keys).
func withoutNotFound(logs, q string) string {
	var keep []string
	for _, l := range strings.SplitAfter(logs, "\n") {
		if l != "" && !(strings.Contains(l, `msg="queue not found`) && strings.HasSuffix(strings.TrimSpace(l), "queue="+q)) {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "")
}

// Issue 42, on RabbitMQ: a configured work queue the broker does not have
// is reported not found and warned about once.
func TestRabbitMQQueueNotFoundWarnsOnce(t *testing.T) {
	b := rabbittest.Start(t)
	ch := b.Channel(t)
	declareTopology(t, ch, "orders", 1)
	c, logs := newTestRabbitCollector(t, b.ManagementURL(), WithQueues(Queue{Name: "orders"}, Queue{Name: "ordrs"}))
	for range 2 {
		want(t, gather(t, c), map[string]float64{`backstop_queue_found{queue="orders"}`: 1, `backstop_queue_found{queue="ordrs"}`: 0, "backstop_up": 1})
	}
	if got := logs.String(); strings.Count(got, "queue not found") != 1 || !strings.Contains(got, "queue=ordrs") {
		t.Errorf("logs after 2 scrapes:\n%s\nwant one warning naming ordrs", got)
	}
}
