package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/internal/testing/rabbittest"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/rabbitmq"
)

// rabbitRetryDelay is the one delay both contenders wait per job: the
// shortest backstop's delay levels hold (level 0, 1 s).
const rabbitRetryDelay = time.Second

// rabbitPrefetch is both contenders' prefetch (unacked deliveries per
// consumer).
const rabbitPrefetch = 64

// BenchmarkRabbitRetryCycle sends b.N jobs through one retry cycle each
// (fail → delay 1 s → redeliver → succeed) against one real rabbitmq-server,
// the contenders one after the other in the same run, and reports jobs/s
// from the first delivery to the last success (the jobs are published
// before the clock starts; both pay that the same).
//
//   - backstop: queue/rabbitmq's Work: the failure is decided by the policy
//     (constant 1 s), the next attempt published to the delay levels with a
//     confirm, then the delivery acked; backstop's headers carry the attempt.
//     One job at a time, and as many as the prefetch (WithConcurrency).
//   - handwritten: the pattern people write by hand: the handler nacks
//     (requeue=false), the work queue dead-letters to a per-delay queue with
//     x-message-ttl 1000 that dead-letters back to the work queue; the
//     retry count is read from x-death. Quorum queues as backstop's (the
//     same storage), and classic ones as the pattern is usually written.
//     Nothing is confirmed (the broker moves the message itself) and no
//     delay but the one TTL exists: a second delay needs another queue.
//     Quorum queues dead-letter at most once unless told otherwise, so a
//     crash can lose the job between the queues: quorum-at-least-once
//     sets x-dead-letter-strategy=at-least-once (and the x-overflow=
//     reject-publish it needs) on both, backstop's guarantee for its
//     delay levels, for a like-for-like comparison.
func BenchmarkRabbitRetryCycle(b *testing.B) {
	broker := rabbittest.Start(b)
	for _, impl := range []string{"backstop/concurrency=1", "backstop/concurrency=64", "handwritten/quorum-at-least-once", "handwritten/quorum", "handwritten/classic"} {
		b.Run(impl, func(b *testing.B) {
			conn := broker.Dial(b)
			var elapsed time.Duration
			switch impl {
			case "backstop/concurrency=1":
				elapsed = backstopRabbitCycle(b, broker.URL(), conn, b.N, 1)
			case "backstop/concurrency=64":
				elapsed = backstopRabbitCycle(b, broker.URL(), conn, b.N, rabbitPrefetch)
			case "handwritten/quorum-at-least-once":
				elapsed = handwrittenRabbitCycle(b, conn, "quorum-at-least-once", b.N)
			case "handwritten/quorum":
				elapsed = handwrittenRabbitCycle(b, conn, "quorum", b.N)
			default:
				elapsed = handwrittenRabbitCycle(b, conn, "classic", b.N)
			}
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "jobs/s")
			b.ReportMetric(0, "ns/op") // a cycle's time is the delay, not a cost per op
		})
	}
}

// handwrittenRabbitCycle runs n jobs through the nack → TTL queue → back
// cycle and returns the time from the consumer's start to the n-th success.
func handwrittenRabbitCycle(b *testing.B, conn *amqp.Connection, kind string, n int) time.Duration {
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	work, retry := "hw-"+kind, "hw-"+kind+".retry.1s"
	for _, q := range []string{work, retry} {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			b.Fatal(err)
		}
	}
	args := func(extra amqp.Table) amqp.Table {
		t := amqp.Table{"x-queue-type": kind}
		if kind == "quorum-at-least-once" {
			t = amqp.Table{"x-queue-type": "quorum", "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}
		}
		for k, v := range extra {
			t[k] = v
		}
		return t
	}
	if _, err := ch.QueueDeclare(work, true, false, false, false,
		args(amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": retry})); err != nil {
		b.Fatal(err)
	}
	if _, err := ch.QueueDeclare(retry, true, false, false, false,
		args(amqp.Table{"x-message-ttl": rabbitRetryDelay.Milliseconds(), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": work})); err != nil {
		b.Fatal(err)
	}
	publishJobs(b, ch, work, n, func(i int) amqp.Publishing {
		return amqp.Publishing{MessageId: "j" + strconv.Itoa(i), DeliveryMode: amqp.Persistent, Body: []byte("x")}
	})

	if err := ch.Qos(rabbitPrefetch, 0, false); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	deliveries, err := ch.Consume(work, "", false, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	for done := 0; done < n; {
		d, ok := <-deliveries
		if !ok {
			b.Fatal("handwritten: the consumer's channel closed")
		}
		// The attempt, as the pattern reads it: one x-death entry per
		// queue the message was dead-lettered from.
		if _, seen := d.Headers["x-death"]; !seen {
			if err := d.Nack(false, false); err != nil {
				b.Fatal(err)
			}
			continue
		}
		if err := d.Ack(false); err != nil {
			b.Fatal(err)
		}
		done++
	}
	elapsed := time.Since(start)
	b.StopTimer()
	ch.Close()
	return elapsed
}

// publishJobs publishes n messages to the default exchange with routing
// key q, confirmed, before the clock starts.
func publishJobs(b *testing.B, ch *amqp.Channel, q string, n int, msg func(i int) amqp.Publishing) {
	b.Helper()
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var pending []*amqp.DeferredConfirmation
	for i := 0; i < n; i++ {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, true, false, msg(i))
		if err != nil {
			b.Fatal(err)
		}
		pending = append(pending, dc)
	}
	for _, dc := range pending {
		if !dc.Wait() {
			b.Fatal("publish not confirmed")
		}
	}
}

// backstopRabbitCyclePolicy retries after a constant rabbitRetryDelay.
var backstopRabbitCyclePolicy = fmt.Sprintf(`{"max_attempts": 3, "backoff": {"strategy": "constant", "base": "%dms"}, "jitter": {"mode": "none"}}`,
	rabbitRetryDelay.Milliseconds())

// backstopRabbitCycle runs n jobs through Work (failing the first attempt,
// succeeding the second) with concurrency jobs at once and returns the
// time from Work's start to the n-th success.
func backstopRabbitCycle(b *testing.B, url string, conn *amqp.Connection, n, concurrency int) time.Duration {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p, err := policy.Parse([]byte(backstopRabbitCyclePolicy))
	if err != nil {
		b.Fatal(err)
	}
	broker, err := rabbitmq.Open(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer broker.Close()
	name := "bs-" + strconv.Itoa(concurrency)
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	defer ch.Close()
	for _, q := range []string{name, rabbitmq.NamesFor(name).DLQ} {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			b.Fatal(err)
		}
	}
	q := broker.Queue(name)
	if err := q.Declare(ctx); err != nil {
		b.Fatal(err)
	}
	now := strconv.FormatInt(time.Now().UnixMilli(), 10)
	publishJobs(b, ch, name, n, func(i int) amqp.Publishing {
		return amqp.Publishing{MessageId: "j" + strconv.Itoa(i), DeliveryMode: amqp.Persistent, Body: []byte("x"),
			Headers: amqp.Table{rabbitmq.HeaderAttempt: "1", rabbitmq.HeaderFirstEnqueuedMs: now, rabbitmq.HeaderDestination: name}}
	})
	var done atomic.Int64
	all := make(chan struct{})
	handler := func(_ context.Context, j queue.Job) error {
		if j.Attempt == 1 {
			return &backstop.Failure{HTTPStatus: 503, Err: errors.New("503")}
		}
		if done.Add(1) == int64(n) {
			close(all)
		}
		return nil
	}
	b.ResetTimer()
	start := time.Now()
	worked := make(chan error, 1)
	go func() {
		worked <- q.Work(ctx, backstop.Native(p), handler, rabbitmq.WithPrefetch(rabbitPrefetch), rabbitmq.WithConcurrency(concurrency))
	}()
	select {
	case <-all:
	case err := <-worked:
		b.Fatalf("Work returned early: %v", err)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	cancel()
	if err := <-worked; err != nil {
		b.Fatal(err)
	}
	return elapsed
}
