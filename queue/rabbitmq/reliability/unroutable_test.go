package reliability

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/rabbitmq"
)

// TestDeletedQueueDoesNotStallTheDelays: 1200 jobs delayed 1 s on queue
// gone, gone deleted, then 50 jobs delayed 1 s on victim. The shared level
// must not fill with gone's unroutable moves: every victim job runs within
// the delays' precision (generous slack here: the machine is shared), and
// the 1200 land in gone.dlq with reason unroutable. Then gone.dlq is
// deleted too: the next delayed jobs of gone land in backstop.unroutable.
// (Before: 0 of 50 victim jobs ran in 45 s, the level's hold queue full of
// moves retried every 10 s.)
func TestDeletedQueueDoesNotStallTheDelays(t *testing.T) {
	const goneJobs, victims = 1200, 50
	broker := shared.Broker(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b, err := rabbitmq.Open(ctx, broker.URL(), rabbitmq.WithLogger(quietLog))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	gone, victim := b.Queue("gone"), b.Queue("victim")
	for _, q := range []*rabbitmq.Queue{gone, victim} {
		if err := q.Declare(ctx); err != nil {
			t.Fatal(err)
		}
	}
	ch := broker.Channel(t)
	conn := broker.Dial(t)
	ids := func(prefix string, n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("%s%05d", prefix, i)
		}
		return out
	}
	// No worker (no mover) yet: the gone jobs wait in level 0 and are all
	// overdue, so they all reach the mover before the victims.
	enqueueAll(t, b, gone, ids("g", goneJobs), rabbitmq.Delay(time.Second))
	if _, err := ch.QueueDelete("gone", false, false, false); err != nil {
		t.Fatal(err)
	}
	p, err := policy.Parse([]byte(workerPolicy))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	late := map[string]time.Duration{}
	handler := func(_ context.Context, j queue.Job) error {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		// Enqueue sets backstop-due-ms; the handler sees the job's first
		// enqueue, and the delay is 1 s.
		late[j.ID] = now.Sub(time.UnixMilli(j.FirstEnqueuedMs).Add(time.Second))
		return nil
	}
	done := make(chan error, 1)
	go func() { done <- victim.Work(ctx, backstop.Native(p), handler, rabbitmq.WithPrefetch(16)) }()
	enqueueAll(t, b, victim, ids("v", victims), rabbitmq.Delay(time.Second))
	eventually.True(t, 60*time.Second, "the victims to run and gone's jobs to be dead-lettered", func() bool {
		mu.Lock()
		ran := len(late)
		mu.Unlock()
		return ran == victims && depth(t, conn, "gone.dlq") == goneJobs
	})
	mu.Lock()
	var worst time.Duration
	var lates []time.Duration
	for _, d := range late {
		lates = append(lates, d)
		worst = max(worst, d)
	}
	mu.Unlock()
	sort.Slice(lates, func(i, j int) bool { return lates[i] < lates[j] })
	t.Logf("victim lateness after due: median %v, worst %v (precision: 1 s)", lates[len(lates)/2], worst)
	// Generous: the 1200 dead letters go first; before the fix the victims
	// never ran.
	if worst > 15*time.Second {
		t.Errorf("a victim job ran %v after its due time", worst)
	}
	reasons := map[string]int{}
	for range goneJobs {
		d, ok, err := ch.Get("gone.dlq", true)
		if err != nil || !ok {
			t.Fatalf("gone.dlq: %v %v", ok, err)
		}
		reasons[fmt.Sprint(d.Headers[rabbitmq.HeaderReason])+": "+fmt.Sprint(d.Headers[rabbitmq.HeaderError])]++
	}
	want := `unroutable: no route to queue "gone": it was deleted or never declared`
	if reasons[want] != goneJobs {
		t.Errorf("gone.dlq's reasons: %v, want %d × %s", reasons, goneJobs, want)
	}

	// The DLQ gone too: to backstop.unroutable.
	if _, err := ch.QueueDelete("gone.dlq", false, false, false); err != nil {
		t.Fatal(err)
	}
	last := ids("h", 5)
	for _, id := range last {
		if err := publishDelayed(ch, "gone", id); err != nil {
			t.Fatal(err)
		}
	}
	eventually.True(t, 30*time.Second, "gone's last jobs in backstop.unroutable", func() bool {
		return depth(t, conn, "backstop.unroutable") == len(last)
	})
	for range last {
		d, ok, err := ch.Get("backstop.unroutable", true)
		if err != nil || !ok || d.Headers[rabbitmq.HeaderReason] != "unroutable" || d.Headers[rabbitmq.HeaderDestination] != "gone" {
			t.Fatalf("backstop.unroutable: %v %v %v", ok, err, d.Headers)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// publishDelayed publishes a job of queue dest delayed 1 s into the levels
// as Enqueue would (Enqueue declares dest again).
func publishDelayed(ch *amqp.Channel, dest, id string) error {
	now := time.Now().UnixMilli()
	if err := ch.Confirm(false); err != nil {
		return err
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "backstop.delay.enter",
		"0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1", false, false, amqp.Publishing{
			MessageId: id, DeliveryMode: amqp.Persistent, Body: []byte("{}"),
			Headers: amqp.Table{rabbitmq.HeaderAttempt: "1", rabbitmq.HeaderFirstEnqueuedMs: strconv.FormatInt(now, 10),
				rabbitmq.HeaderDestination: dest, rabbitmq.HeaderDueMs: strconv.FormatInt(now+1000, 10)}})
	if err != nil {
		return err
	}
	if !dc.Wait() {
		return fmt.Errorf("publish %s not confirmed", id)
	}
	return nil
}

// depth is the number of ready messages in queue name (a passive declare:
// at once, where the management API's figures lag by seconds); -1 when it
// does not exist.
func depth(t *testing.T, conn *amqp.Connection, name string) int {
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		return -1
	}
	return q.Messages
}
