package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/internal/testing/rabbittest"
	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/rabbitmq"
)

// Issue 12: queue stats, dlq inspect and dlq replay with --amqp.url, their
// output compared whole against a real broker.
func TestQueueCommandsOnRabbitMQ(t *testing.T) {
	b := rabbittest.Start(t)
	ctx := context.Background()
	br, err := rabbitmq.Open(ctx, b.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	if err := br.Queue("orders").Declare(ctx); err != nil {
		t.Fatal(err)
	}
	ch := b.Channel(t)
	ch.Confirm(false)
	publish := func(key, id, reason string) {
		h := amqp.Table{"backstop-attempt": "3", "backstop-first-enqueued-ms": "1700000000000", "backstop-destination": "orders"}
		if reason != "" {
			h["backstop-reason"], h["backstop-error"] = reason, "HTTP 4xx\nwith a body"
		}
		dc, err := ch.PublishWithDeferredConfirm("", key, false, false, amqp.Publishing{MessageId: id, DeliveryMode: amqp.Persistent, Body: []byte("{}"), Headers: h})
		if err != nil || !dc.Wait() {
			t.Fatalf("publish %s: %v", id, err)
		}
	}
	publish("orders.dlq", "job-a", "permanent_error")
	publish("orders.dlq", "job-b", "max_attempts_reached")
	publish("orders.dlq", "job-c", "permanent_error")
	publish("orders", "job-d", "")
	url := "--amqp.url=" + b.URL()

	check := func(want string, args ...string) {
		t.Helper()
		out, err := runCLI(t, "", args...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		if out != want {
			t.Errorf("%v:\n%s\nwant:\n%s", args, out, want)
		}
	}
	check(`queue orders: 3 dead letters
  permanent_error       2
  max_attempts_reached  1

oldest:
  job    type  attempt  reason                error
  job-a  -     3        permanent_error       HTTP 4xx with a body
  job-b  -     3        max_attempts_reached  HTTP 4xx with a body
`, "dlq", "inspect", "--queue", "orders", "--newest", "2", url)
	check(`queue orders: 1 jobs (? unacked), 3 dead letters
  ready         1
  consumers     0
  delay levels  0  (delayed jobs of every queue of the vhost: RabbitMQ counts no delayed jobs per queue)
  (unacked comes from the management API: --rabbitmq.management-url)
`, "queue", "stats", "--queue", "orders", url)
	check("replayed 0 dead letters of queue orders to orders (attempt count reset)\n",
		"dlq", "replay", "--queue", "orders", "--limit", "5", "--type", "send_email", url)
	check("replayed 2 dead letters of queue orders to orders (attempt count reset)\n",
		"dlq", "replay", "--queue", "orders", "--limit", "5", "--reason", "permanent_error", url)

	// The environment names the broker; the management API gives what
	// AMQP cannot (it refreshes its figures every few seconds).
	t.Setenv("BACKSTOP_AMQP_URL", b.URL())
	t.Setenv("BACKSTOP_RABBITMQ_MANAGEMENT_URL", "http://guest:guest@"+strings.TrimPrefix(b.ManagementURL(), "http://"))
	want := "queue orders: 3 jobs (0 unacked), 1 dead letters\n  ready         3\n  consumers     0\n" +
		"  delay levels  0  (delayed jobs of every queue of the vhost: RabbitMQ counts no delayed jobs per queue)\n"
	var out string
	eventually.True(t, 30*time.Second, "the management API's figures", func() bool {
		out, err = runCLI(t, "", "queue", "stats", "--queue", "orders")
		return err == nil && out == want
	})
	out, err = runCLI(t, "", "queue", "stats", "--queue", "orders", "--json")
	var s map[string]int64
	if err := json.Unmarshal([]byte(out), &s); err != nil || s["ready"] != 3 || s["dlq"] != 1 || s["unacked"] != 0 || s["delay_levels"] != 0 || len(s) != 5 {
		t.Errorf("queue stats --json: %s (%v)", out, err)
	}
	out, err = runCLI(t, "", "dlq", "inspect", "--queue", "orders", "--json")
	if err != nil || !strings.Contains(out, `"size":1,"scanned":1,"by_reason":{"max_attempts_reached":1},"oldest":[{"job_id":"job-b","attempt":"3"`) {
		t.Errorf("dlq inspect --json: %v\n%s", err, out)
	}
	check("replayed 1 dead letters of queue orders to orders (attempt count kept)\n",
		"dlq", "replay", "--queue", "orders", "--limit", "1", "--keep-attempts")

	// A flag wins over the environment: --redis.url goes to Redis.
	if _, err := runCLI(t, "", "queue", "stats", "--queue", "orders", "--redis.url", "redis://127.0.0.1:1/0"); err == nil || !strings.Contains(err.Error(), "cannot reach Redis at 127.0.0.1:1") {
		t.Errorf("--redis.url with BACKSTOP_AMQP_URL set: %v, want Redis", err)
	}
	t.Setenv("BACKSTOP_AMQP_URL", "")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"queue", "stats", "--queue", "nope", url}, `queue nope: stats: no such queue: no queue "nope" in this virtual host`},
		{[]string{"dlq", "replay", "--queue", "orders", "--limit", "1", "--reason", "a b", url}, `reason must be "" (any) or 1..128 printable ASCII characters without spaces`},
		{[]string{"queue", "stats", "--queue", "orders", "--amqp.url", "amqp://guest:guest@127.0.0.1:1/"}, "cannot reach RabbitMQ at 127.0.0.1:1: dial tcp 127.0.0.1:1: connect: connection refused (check --amqp.url or BACKSTOP_AMQP_URL)"},
		{[]string{"queue", "stats", "--queue", "orders", "--amqp.url", "redis://x:y@127.0.0.1:1/"}, `--amqp.url: want amqp://user:password@host:5672/vhost or amqps://…, got "redis://x:xxxxx@127.0.0.1:1/"`},
	} {
		if _, err := runCLI(t, "", c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
	for _, args := range [][]string{
		{"queue", "stats", "--queue", "orders", url, "--redis.url", "redis://127.0.0.1:1/0"},
		{"dlq", "replay", "--queue", "orders", url},
		{"dlq", "replay", "--queue", "orders", "--limit", "1", "--rate", "fast", url},
		{"dlq", "purge", "--queue", "orders", url},
		{"dlq", "delete", "--queue", "orders", "--reason", "x", url},
		{"dlq", "inspect", "--queue", "orders", "--group", "g", url},
	} {
		if _, err := runCLI(t, "", args...); !errors.Is(err, errUsage) {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}

	// Issue 41: every command reaches the broker through queue.Queue: queue
	// enqueue works on RabbitMQ too, and queue types says what RabbitMQ
	// cannot do, where it dialled Redis before.
	check("enqueued job \"job-e\" (type send_email) to orders\n",
		"queue", "enqueue", "--queue", "orders", "--id", "job-e", "--type", "send_email", url)
	if dl := rabbittest.Drain(t, ch, "orders"); len(dl) == 0 || dl[len(dl)-1].MessageId != "job-e" || dl[len(dl)-1].Headers["backstop-job-type"] != "send_email" {
		t.Errorf("queue enqueue: the queue's last message is not job-e of type send_email: %d messages", len(dl))
	}
	if _, err := runCLI(t, "", "queue", "types", "--queue", "orders", url); !errors.Is(err, queue.ErrUnsupported) ||
		!strings.Contains(err.Error(), "queue orders: job types: not supported by rabbitmq") {
		t.Errorf("queue types: %v, want queue.ErrUnsupported", err)
	}

	// Issue 45: queue run takes delayed jobs from the delay levels to the
	// queue, attempt kept (it was not supported: ErrUnsupported).
	for _, id := range []string{"job-f", "job-g", "job-h"} {
		if err := br.Queue("orders").Enqueue(ctx, id, []byte("{}"), rabbitmq.Delay(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	check("moved job \"job-g\" of queue orders from orders.delay to orders\n", "queue", "run", "--queue", "orders", "--id", "job-g", url)
	if _, err := runCLI(t, "", "queue", "run", "--queue", "orders", "--id", "job-g", url); err == nil ||
		!strings.Contains(err.Error(), `queue orders: no delayed job with id "job-g" in orders.delay, nothing moved`) {
		t.Errorf("queue run of a job no longer delayed: %v", err)
	}
	before := time.Now().Add(2 * time.Hour).UTC().Format(time.RFC3339)
	check(`{"left":1,"moved":1,"queue":"orders"}`+"\n", "queue", "run", "--queue", "orders", "--all-due-before", before, "--limit", "1", "--json", url)
	check("moved 1 delayed jobs of queue orders to orders; 0 more due before "+before+"\n",
		"queue", "run", "--queue", "orders", "--all-due-before", before, "--limit", "5", url)
	if dl := rabbittest.Drain(t, ch, "orders"); len(dl) != 3 || dl[0].MessageId != "job-g" || dl[0].Headers["backstop-due-ms"] != nil || dl[0].Headers["backstop-attempt"] != "1" {
		t.Errorf("queue run: the queue holds %d messages, want job-g first without a due time, then the two others", len(dl))
	}

	// backstop console samples the queue through the management API (its
	// user and password in the URL), in the AMQP URL's virtual host.
	addr := consoleAt(t, url, "--rabbitmq.management-url="+strings.Replace(b.ManagementURL(), "http://", "http://guest:guest@", 1),
		"--queue=orders", "--sample.interval=1s")
	if body := overviewUntil(t, addr, `<td class="ingested">0</td>`, "every 1s,", "since "); strings.Contains(body, "Last sample failed") {
		t.Errorf("console: a sample failed:\n%s", body)
	}
	// A management API that cannot be read: the overview says so, and
	// shows no password.
	addr = consoleAt(t, url, "--rabbitmq.management-url=http://guest:s3cret-mgmt@127.0.0.1:1", "--queue=orders", "--sample.interval=1s")
	if body := overviewUntil(t, addr, "Last sample failed: rabbitmq management api"); strings.Contains(body, "s3cret-mgmt") {
		t.Errorf("console: the management API's password shows:\n%s", body)
	}
}
