package reliability

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/internal/testing/rabbittest"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/rabbitmq"
)

// TestDelayLevelSurvivesALostDeadLetterWorker: the crash test's stall.
// RabbitMQ 3.10 dead-letters an expired message of a quorum queue with
// x-dead-letter-strategy=at-least-once through a worker process of the
// queue's leader (rabbit_fifo_dlx_worker); when that process ends while
// the queue keeps its leader (it ends by itself when it loses sight of the
// leader's process, as after a restart under load), the broker starts no
// other until a new leader is elected, which one node never does. The
// first topology's levels were such queues: after the crash test's second
// broker restart, thousands of retries sat in backstop.delay.L0 as
// messages_dlx for good. Here the workers are ended as the broker ends
// them (supervisor:terminate_child, never restarted); a message expiring
// in a TTL level then stays there, and a job retried through the hold
// levels still comes back.
func TestDelayLevelSurvivesALostDeadLetterWorker(t *testing.T) {
	broker := rabbittest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b, err := rabbitmq.Open(ctx, broker.URL(), rabbitmq.WithLogger(quietLog))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	q := b.Queue("lostdlx")
	if err := q.Declare(ctx); err != nil {
		t.Fatal(err)
	}
	out, err := broker.Ctl("eval", `[supervisor:terminate_child(rabbit_fifo_dlx_sup, P) || {_, P, _, _} <- supervisor:which_children(rabbit_fifo_dlx_sup)], length(supervisor:which_children(rabbit_fifo_dlx_sup)).`)
	if err != nil || strings.TrimSpace(out) != "0" {
		t.Fatalf("ending the dead-letter workers: %v, %q workers left", err, out)
	}

	// The broker's path: a message put in the first topology's level 0
	// (TTL 1 s, dead-lettered to the deliver exchange) stays there.
	ch := broker.Channel(t)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", "backstop.delay.L0", false, false, amqp.Publishing{
		MessageId: "by-ttl", DeliveryMode: amqp.Persistent,
		Headers: amqp.Table{rabbitmq.HeaderDestination: "lostdlx", rabbitmq.HeaderAttempt: "1", rabbitmq.HeaderFirstEnqueuedMs: "1"}})
	if err != nil || !dc.Wait() {
		t.Fatalf("publish to backstop.delay.L0: %v", err)
	}

	// The workers' path: a job that fails once (503, retried after 1 s).
	p, err := policy.Parse([]byte(workerPolicy))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var runs []string
	done := make(chan error, 1)
	go func() {
		done <- q.Work(ctx, backstop.Native(p), func(_ context.Context, j queue.Job) error {
			mu.Lock()
			defer mu.Unlock()
			runs = append(runs, j.ID)
			if j.ID == "retried" && j.Attempt == 1 {
				return &backstop.Failure{HTTPStatus: 503, Err: errors.New("503")}
			}
			return nil
		})
	}()
	if err := q.Enqueue(ctx, "retried", nil); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, 60*time.Second, "the retried job back through the hold levels", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(runs) >= 2 && runs[0] == "retried" && runs[1] == "retried"
	})
	// Past its 1 s TTL (the retried job waited that long), the other is in
	// its level as held for dead lettering (management API), and never ran.
	eventually.True(t, 30*time.Second, "the management API to count the stranded message", func() bool {
		return queueFigure(broker, "backstop.delay.L0", "messages_dlx") == 1
	})
	mu.Lock()
	for _, id := range runs {
		if id == "by-ttl" {
			t.Errorf("the message in the TTL level ran: RabbitMQ replaced its dead-letter worker, and the premise of the hold levels changed")
		}
	}
	mu.Unlock()
	if out, _ := broker.Ctl("eval", `length(supervisor:which_children(rabbit_fifo_dlx_sup)).`); strings.TrimSpace(out) != "0" {
		t.Errorf("dead-letter workers came back (%s): the hold levels' test proves nothing", strings.TrimSpace(out))
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
