package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/internal/testing/logbuf"
)

const rejectedLog = "rabbitmq publish rejected; trying again"

// TestEnqueueRetriesRejected: a negative confirm (here a queue full under
// a max-length policy, x-overflow=reject-publish) is published again a
// bounded number of times, then returned as ErrRejected; a message
// refused at first and taken once there is room is enqueued once.
func TestEnqueueRetriesRejected(t *testing.T) {
	rb := shared.Broker(t)
	logs := &logbuf.Buffer{}
	b := openBroker(t, rb.URL(), WithLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	ctx := context.Background()
	q := b.Queue("enqueue-full")
	if err := q.Declare(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := rb.Ctl("set_policy", "--apply-to", "queues", "enqueue-full-max", "^enqueue-full$", `{"max-length":1}`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rb.Ctl("clear_policy", "enqueue-full-max") })
	ch := rb.Channel(t)
	if err := q.Enqueue(ctx, "fills", nil); err != nil {
		t.Fatal(err)
	}
	refusing(t, ch, "enqueue-full")

	err := q.Enqueue(ctx, "refused", nil)
	if !errors.Is(err, ErrRejected) {
		t.Fatalf("Enqueue into a full queue: %v, want ErrRejected", err)
	}
	if n := strings.Count(logs.String(), rejectedLog); n != rejectTries-1 {
		t.Errorf("a refused message was published again %d times, want %d (rejectTries - 1)", n, rejectTries-1)
	}

	// Room is made after the first refusal: the next try is taken.
	before := strings.Count(logs.String(), rejectedLog)
	done := make(chan error, 1)
	go func() { done <- q.Enqueue(ctx, "taken", nil) }()
	eventually.True(t, wait, "Enqueue to be refused once", func() bool {
		return strings.Count(logs.String(), rejectedLog) > before
	})
	if _, err := ch.QueuePurge("enqueue-full", false); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Enqueue once the queue has room: %v", err)
	}
	got := takeAll(t, ch, "enqueue-full")
	if len(got) != 1 || got[0].MessageId != "taken" {
		t.Fatalf("the queue holds %d messages (%v), want the one job taken", len(got), got)
	}
}

// refusing waits until the broker refuses a publish to queue name (a
// max-length policy reaches a queue in its own time), publishing probes
// (message id "probe") on ch, which it puts in confirm mode.
func refusing(t *testing.T, ch *amqp.Channel, name string) {
	t.Helper()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, wait, "a max-length policy to refuse publishes to "+name, func() bool {
		dc, err := ch.PublishWithDeferredConfirm("", name, false, false, amqp.Publishing{MessageId: "probe"})
		if err != nil {
			t.Fatal(err)
		}
		return !dc.Wait()
	})
}

// TestEnqueueConcurrentIntoNewQueue: producers enqueuing at once into a
// just-created queue (once refused with "full queue": see Enqueue) all
// succeed, each job once.
func TestEnqueueConcurrentIntoNewQueue(t *testing.T) {
	rb := shared.Broker(t)
	ch := rb.Channel(t)
	const producers, each = 8, 25
	for round := range 3 {
		b := openBroker(t, rb.URL())
		name := fmt.Sprintf("enqueue-new-%d-%d", round, time.Now().UnixNano())
		q := b.Queue(name)
		var wg sync.WaitGroup
		errs := make(chan error, producers*each)
		for p := range producers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range each {
					if err := q.Enqueue(context.Background(), fmt.Sprintf("p%d-%d", p, i), nil); err != nil {
						errs <- err
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("round %d: %v", round, err)
		}
		if n := depth(t, ch, name); n != producers*each {
			t.Errorf("round %d: %s holds %d jobs, want %d", round, name, n, producers*each)
		}
		for _, x := range []string{name, NamesFor(name).DLQ} {
			ch.QueueDelete(x, false, false, false)
		}
		for _, x := range []string{NamesFor(name).Delay, NamesFor(name).Due} {
			ch.ExchangeDelete(x, false, false)
		}
	}
}
