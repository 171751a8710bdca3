package exporter

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/internal/testing/logbuf"
	"github.com/backstop-dev/backstop/internal/testing/rabbittest"
	"github.com/backstop-dev/backstop/queue/rabbitmq/rabbitnames"
)

// declareTopology declares queue q's part of the topology of
// queue/rabbitmq/README.md, and the shared delay levels, with plain
// amqp091-go (the exporter must read what the README says, whoever
// declared it).
func declareTopology(t testing.TB, ch *amqp.Channel, q string, deliveryLimit int) {
	t.Helper()
	key := func(n int, v string) string {
		w := strings.Split(strings.Repeat("*.", 17)+"*", ".")
		w[17-n] = v
		return strings.Join(w, ".")
	}
	must(t, ch.ExchangeDeclare("backstop.delay.deliver", "headers", true, false, false, false, nil))
	for n := range 18 {
		ex, next := fmt.Sprintf("backstop.delay.L%d", n), "backstop.delay.deliver"
		if n > 0 {
			next = fmt.Sprintf("backstop.delay.L%d", n-1)
		}
		must(t, ch.ExchangeDeclare(ex, "topic", true, false, false, false, nil))
		_, err := ch.QueueDeclare(ex, true, false, false, false, amqp.Table{"x-queue-type": "quorum", "x-message-ttl": int64(1000) << n,
			"x-dead-letter-exchange": next, "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"})
		must(t, err)
		must(t, ch.QueueBind(ex, key(n, "1"), ex, false, nil))
		must(t, ch.ExchangeBind(next, key(n, "0"), ex, false, nil))
	}
	_, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum", "x-delivery-limit": int64(deliveryLimit),
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": rabbitnames.For(q).DLQ, "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"})
	must(t, err)
	_, err = ch.QueueDeclare(rabbitnames.For(q).DLQ, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	must(t, err)
	must(t, ch.ExchangeDeclare(rabbitnames.For(q).Delay, "fanout", true, false, false, false, nil))
	must(t, ch.ExchangeBind("backstop.delay.L17", "", rabbitnames.For(q).Delay, false, nil))
	must(t, ch.ExchangeDeclare(rabbitnames.For(q).Due, "fanout", true, false, false, false, nil))
	must(t, ch.QueueBind(q, "", rabbitnames.For(q).Due, false, nil))
	must(t, ch.ExchangeBind(rabbitnames.For(q).Due, "", "backstop.delay.deliver", false, amqp.Table{"x-match": "all", "backstop-destination": q}))
}

// delayKey is the routing key of a delay of sec seconds: its 18 bits,
// most significant first.
func delayKey(sec int) string {
	w := make([]string, 18)
	for i := range w {
		w[i] = fmt.Sprint(sec >> (17 - i) & 1)
	}
	return strings.Join(w, ".")
}

// publisher publishes with confirms, as the workers do.
type publisher struct {
	t    testing.TB
	ch   *amqp.Channel
	acks chan amqp.Confirmation
}

func newPublisher(t testing.TB, conn *amqp.Connection) *publisher {
	ch, err := conn.Channel()
	must(t, err)
	must(t, ch.Confirm(false))
	return &publisher{t: t, ch: ch, acks: ch.NotifyPublish(make(chan amqp.Confirmation, 1))}
}

func (p *publisher) publish(exchange, key, id string, headers amqp.Table) {
	p.t.Helper()
	must(p.t, p.ch.PublishWithContext(context.Background(), exchange, key, false, false,
		amqp.Publishing{MessageId: id, DeliveryMode: amqp.Persistent, Headers: headers, Body: []byte("{}")}))
	if c := <-p.acks; !c.Ack {
		p.t.Fatalf("publish %s to %q/%q: nacked", id, exchange, key)
	}
}

func TestRabbitMQ(t *testing.T) {
	b := rabbittest.Start(t)
	conn := b.Dial(t)
	ch, err := conn.Channel()
	must(t, err)
	declareTopology(t, ch, "orders", 1)
	declareTopology(t, ch, "emails", 5)
	// A queue the pattern matches that is not a work queue of backstop's.
	_, err = ch.QueueDeclare("other", true, false, false, false, nil)
	must(t, err)
	pub := newPublisher(t, conn)
	job := amqp.Table{"backstop-destination": "orders", "backstop-attempt": "1"}

	// A poison message: returned twice, over x-delivery-limit 1, the
	// broker dead-letters it itself.
	pub.publish("", "orders", "poison", job)
	getter, err := conn.Channel()
	must(t, err)
	for {
		d, ok, err := getter.Get("orders", false)
		must(t, err)
		if !ok {
			break
		}
		must(t, d.Nack(false, true))
	}
	must(t, getter.Close())
	for i := range 4 {
		pub.publish("", "orders", fmt.Sprint("job-", i), job)
	}
	// A worker finishes one job and holds the next (unacked).
	worker, err := conn.Channel()
	must(t, err)
	must(t, worker.Qos(1, 0, false))
	deliveries, err := worker.Consume("orders", "", false, false, false, false, nil)
	must(t, err)
	must(t, (<-deliveries).Ack(false))
	held := <-deliveries
	// Two dead letters from a worker, one retry due in 1 s (it arrives
	// in orders), one in an hour (it stays in level 11: 3600 = 0b111000010000).
	pub.publish("", "orders.dlq", "dead-1", amqp.Table{"backstop-reason": "permanent_error"})
	pub.publish("", "orders.dlq", "dead-2", amqp.Table{"backstop-reason": "max_attempts_reached"})
	pub.publish("orders.delay", delayKey(1), "soon", job)
	pub.publish("orders.delay", delayKey(3600), "later", job)
	// And one in a hold level, where the workers' movers take them (the
	// level's gauge counts both kinds of queue).
	_, err = ch.QueueDeclare("backstop.hold.L10", true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	must(t, err)
	pub.publish("", "backstop.hold.L10", "held", job)
	// One dead letter an operator discarded: recorded in orders.audit.
	_, err = ch.QueueDeclare("orders.audit", true, false, false, false, nil)
	must(t, err)
	pub.publish("", "orders.audit", "discarded-1", amqp.Table{"backstop-audit-action": "purge"})

	c, logs := newTestRabbitCollector(t, b.ManagementURL(), WithQueues(Queue{Name: "orders"}), WithRabbitMQPattern("emails|other|nothing.*"))
	wantNow := map[string]float64{
		`backstop_up`:     1,
		`backstop_queues`: 2,
		`backstop_stream_lag_jobs{group="",queue="orders"}`:     3, // 4 jobs - 2 taken + the 1 s retry
		`backstop_stream_pending_jobs{group="",queue="orders"}`: 1,
		`backstop_rabbitmq_consumers{queue="orders"}`:           1,
		`backstop_dlq_size{queue="orders"}`:                     3, // the poison too
		`backstop_dlq_ingested_total{queue="orders"}`:           2, // the broker's own dead letter is not counted by 3.10
		`backstop_dlq_discarded_total{queue="orders"}`:          1,
		`backstop_delayed_queue_size{queue="orders"}`:           1,
		`backstop_rabbitmq_delay_messages{level="11"}`:          1,
		`backstop_rabbitmq_delay_messages{level="0"}`:           0,
		`backstop_rabbitmq_delay_messages{level="10"}`:          1,
		`backstop_stream_lag_jobs{group="",queue="emails"}`:     0,
		`backstop_delayed_queue_size{queue="emails"}`:           0,
		`backstop_dlq_size{queue="emails"}`:                     0,
		`backstop_dlq_ingested_total{queue="emails"}`:           0,
		`backstop_scrape_errors_total{kind="connection"}`:       0,
	}
	// The management statistics are emitted every 5 s: wait for them.
	var got map[string]float64
	matches := func() bool {
		got = gather(t, c)
		for k, v := range wantNow {
			if g, ok := got[k]; !ok || g != v {
				return false
			}
		}
		return true
	}
	if err := eventually.Wait(60*time.Second, matches); err != nil {
		want(t, got, wantNow)
		t.Fatalf("the figures never matched; logs: %s", logs)
	}
	want(t, got, nil,
		`backstop_stream_lag_jobs{group="",queue="other"}`,           // not a work queue
		`backstop_stream_lag_jobs{group="",queue="orders.dlq"}`,      // a DLQ
		`backstop_rabbitmq_head_message_age_seconds{queue="orders"}`, // quorum queues on 3.10 do not report it
		`backstop_dlq_discarded_total{queue="emails"}`,               // no emails.audit: nothing was ever discarded
	)
	must(t, held.Ack(false))

	// The alerter's reading gives the scrape's figures.
	qs, err := c.Queues(context.Background())
	if err != nil || len(qs) != 2 || qs[0].Name != "emails" || qs[1].Name != "orders" {
		t.Errorf("Queues = %v, %v; want emails and orders", qs, err)
	}
	ins, err := c.DLQIngestion(context.Background())
	if err != nil || len(ins) != 2 || ins[1] != (DLQIngestion{Queue: "orders", Ingested: 2, Known: true, Size: 3}) {
		t.Errorf("DLQIngestion = %+v, %v", ins, err)
	}

	t.Run("lint", func(t *testing.T) {
		resp, err := http.Get(serve(t, c))
		must(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		must(t, err)
		problems, err := promlint.New(bytes.NewReader(body)).Lint()
		must(t, err)
		for _, p := range problems {
			t.Errorf("promlint: %s: %s", p.Metric, p.Text)
		}
	})

	t.Run("wrong password", func(t *testing.T) {
		c, _ := newTestRabbitCollector(t, b.ManagementURL(), WithQueues(Queue{Name: "orders"}), WithRabbitMQCredentials("guest", "wrong"))
		want(t, gather(t, c), map[string]float64{`backstop_up`: 0, `backstop_scrape_errors_total{kind="auth"}`: 1},
			`backstop_dlq_size{queue="orders"}`)
	})
	t.Run("credentials in the url", func(t *testing.T) {
		u := strings.Replace(b.ManagementURL(), "http://", "http://guest:guest@", 1)
		c, err := NewRabbitMQCollector(u, WithQueues(Queue{Name: "orders"}))
		must(t, err)
		want(t, gather(t, c), map[string]float64{`backstop_up`: 1, `backstop_dlq_size{queue="orders"}`: 3})
	})

	// Issue 45: the oldest job's age of a RabbitMQ queue, the Redis
	// family's name (the "queue stuck" alert), from the arrival counts.
	t.Run("oldest job age", func(t *testing.T) {
		declareTopology(t, ch, "stuck", 5)
		pub.publish("", "stuck", "stuck-1", amqp.Table{"backstop-destination": "stuck", "backstop-attempt": "1"})
		pub.publish("", "stuck", "stuck-2", amqp.Table{"backstop-destination": "stuck", "backstop-attempt": "1"})
		c, _ := newTestRabbitCollector(t, b.ManagementURL(), WithQueues(Queue{Name: "stuck"}))
		clock := time.Now()
		c.cfg.now = func() time.Time { return clock }
		age := `backstop_oldest_job_age_seconds{queue="stuck"}`
		var got map[string]float64
		if err := eventually.Wait(60*time.Second, func() bool {
			got = gather(t, c)
			return got[`backstop_stream_lag_jobs{group="",queue="stuck"}`] == 2
		}); err != nil {
			t.Fatalf("the two jobs never showed: %v", got)
		}
		want(t, got, map[string]float64{age: 0})
		clock = clock.Add(2 * time.Hour) // nobody works the queue
		want(t, gather(t, c), map[string]float64{age: 7200})
		getter, err := conn.Channel()
		must(t, err)
		for range 2 {
			_, ok, err := getter.Get("stuck", true)
			must(t, err)
			if !ok {
				t.Fatal("stuck: no message to take")
			}
		}
		must(t, getter.Close())
		clock = clock.Add(time.Minute)
		if err := eventually.Wait(60*time.Second, func() bool { got = gather(t, c); return got[age] == 0 }); err != nil {
			t.Fatalf("the age of an emptied queue: %v", got[age])
		}
	})

	t.Run("broker down", func(t *testing.T) {
		srv := httptest.NewServer(c.Handler(nil))
		defer srv.Close()
		conn.Close()
		b.Stop()
		resp, err := http.Get(srv.URL)
		must(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /metrics with the broker down: %s\n%s", resp.Status, body)
		}
		for _, line := range []string{"backstop_up 0", `backstop_scrape_errors_total{kind="connection"} 1`} {
			if !strings.Contains(string(body), line+"\n") {
				t.Errorf("no %q in the scrape:\n%s", line, body)
			}
		}
		if strings.Contains(string(body), "backstop_dlq_size") {
			t.Errorf("queue figures served with the broker down:\n%s", body)
		}
	})
}

// newTestRabbitCollector returns a collector of the management API at url
// (user guest unless opts say otherwise) with a logger into the returned
// buffer.
func newTestRabbitCollector(t testing.TB, url string, opts ...Option) (*Collector, *logbuf.Buffer) {
	t.Helper()
	logs := &logbuf.Buffer{}
	opts = append([]Option{WithLogger(slog.New(slog.NewTextHandler(logs, nil))), WithRabbitMQCredentials("guest", "guest")}, opts...)
	c, err := NewRabbitMQCollector(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c, logs
}

func TestNewRabbitMQCollectorErrors(t *testing.T) {
	for _, tc := range []struct {
		url  string
		opts []Option
		err  string
	}{
		{"localhost:15672", []Option{WithQueues(Queue{Name: "a"})}, "must be http:// or https://"},
		{"http://localhost:15672", nil, "no queues"},
		{"http://localhost:15672", []Option{WithRabbitMQPattern("(")}, "rabbitmq queue pattern"},
		{"http://localhost:15672", []Option{WithQueues(Queue{Name: "a"}, Queue{Name: "a"})}, `queue "a" given twice`},
		{"http://localhost:15672", []Option{WithQueues(Queue{Name: "a"}), WithRabbitMQVHost("")}, "vhost must not be empty"},
		{"http://localhost:15672", []Option{WithPattern("{*}:jobs", time.Minute, 10)}, "use WithRabbitMQPattern"},
		{"http://localhost:15672", []Option{WithQueues(Queue{Name: "a\x01"})}, `queue name "a\x01"`},
	} {
		_, err := NewRabbitMQCollector(tc.url, tc.opts...)
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("NewRabbitMQCollector(%q) = %v, want an error with %q", tc.url, err, tc.err)
		}
	}
}
