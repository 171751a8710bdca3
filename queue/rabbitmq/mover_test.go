package rabbitmq

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/internal/testing/logbuf"
)

// Issue 40: a move the broker refuses (a work queue at its max-length) is
// not held in the mover: it re-enters the delay for 10 s, counted in
// backstop-move-refusals, and the 30th refusal dead-letters it
// (unroutable). (Before, it was held unacked in its level and tried every
// 10 s for ever.)
func TestRefusedMoveReentersTheDelay(t *testing.T) {
	broker := shared.Broker(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logs logbuf.Buffer
	b, err := Open(ctx, broker.URL(), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	q := b.Queue("full")
	if err := q.Declare(ctx); err != nil {
		t.Fatal(err)
	}
	if out, err := broker.Ctl("set_policy", "full-queue", "^full$", `{"max-length": 1}`, "--apply-to", "queues"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	t.Cleanup(func() { broker.Ctl("clear_policy", "full-queue") })
	conn := broker.Dial(t)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	// Full: a quorum queue takes a publish or so past its max-length
	// before it refuses.
	eventually.True(t, 10*time.Second, "the work queue to refuse a publish", func() bool {
		err := confirmPublish(ctx, ch, "", "full", amqp.Publishing{MessageId: "filler", Body: []byte("{}")})
		return err != nil
	})
	now := time.Now().UnixMilli()
	for id, refusals := range map[string]string{"refused-once": "", "refused-29": "29"} {
		h := amqp.Table{HeaderAttempt: "1", HeaderFirstEnqueuedMs: itoa(now), HeaderDestination: "full", HeaderDueMs: itoa(now + 1000)}
		if refusals != "" {
			h[HeaderMoveRefusals] = refusals
		}
		if err := confirmPublish(ctx, ch, enterXchg, delayRoutingKey(1), amqp.Publishing{MessageId: id, Headers: h, Body: []byte("{}")}); err != nil {
			t.Fatal(err)
		}
	}
	mctx, stop := context.WithCancel(ctx)
	moved := make(chan struct{})
	go func() { defer close(moved); q.move(mctx) }()
	eventually.True(t, 20*time.Second, "the 30th refusal dead-lettered and the first delayed again", func() bool {
		st, err := ch.QueueDeclarePassive("full.dlq", true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		return st.Messages == 1 && strings.Contains(logs.String(), "job=refused-once")
	})
	stop()
	<-moved // the re-entered message is back in its level, ready

	d, ok, err := ch.Get("full.dlq", true)
	if err != nil || !ok {
		t.Fatalf("full.dlq: %v %v", ok, err)
	}
	if d.MessageId != "refused-29" || d.Headers[HeaderReason] != "unroutable" ||
		!strings.HasPrefix(headerString(d.Headers, HeaderError), "the broker refused the delayed message's move 30 times") {
		t.Errorf("dead letter %s: %v", d.MessageId, d.Headers)
	}
	// Due again 10 s after the refusal: the 8 s level holds it, with the
	// refusal counted.
	var found bool
	for n := range holdLevels {
		for {
			d, ok, err := ch.Get(holdQueue+itoa(int64(n)), false)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				break
			}
			if d.MessageId != "refused-once" {
				continue // another test's: back when ch closes
			}
			found = true
			d.Ack(false)
			due, _, _ := headerDigits(d.Headers[HeaderDueMs])
			if n != 3 || d.Headers[HeaderMoveRefusals] != "1" || due < now+10_000 || due > time.Now().UnixMilli()+10_000 {
				t.Errorf("re-entered in level %d with %v (due in %d ms from the start)", n, d.Headers, due-now)
			}
		}
	}
	if !found {
		t.Errorf("the refused move is in no level")
	}
}
