package reliability

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/queue/rabbitmq"
)

// TestPoisonMessageReachesTheDLQ: a job whose handler kills its worker
// process, among 200 that succeed, with two worker processes (prefetch 1:
// a crash returns only the job it ran) restarted whenever they die. The
// poison runs max deliveries (5) times, then a worker dead-letters it as
// crash_loop without running it; the other jobs all finish.
func TestPoisonMessageReachesTheDLQ(t *testing.T) {
	const queueName, others = "poisoned", 200
	broker := shared.Broker(t)
	ctx := context.Background()
	b, err := rabbitmq.Open(ctx, broker.URL(), rabbitmq.WithLogger(quietLog))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	q := b.Queue(queueName)
	if err := q.Declare(ctx); err != nil {
		t.Fatal(err)
	}
	ids := []string{"poison"}
	for i := range others {
		ids = append(ids, fmt.Sprintf("p%05d", i))
	}
	enqueueAll(t, b, q, ids)
	ledger := filepath.Join(t.TempDir(), "ledger")
	f := newFleet(t, "poison", 2, "BACKSTOP_RELIABILITY_URL="+broker.URL(), "BACKSTOP_RELIABILITY_QUEUE="+queueName,
		"BACKSTOP_RELIABILITY_LEDGER="+ledger, "BACKSTOP_RELIABILITY_MAX_DELIVERIES=5",
		"BACKSTOP_RELIABILITY_PREFETCH=1", "BACKSTOP_RELIABILITY_CONCURRENCY=1")
	ch := broker.Channel(t)
	var dl amqp.Delivery
	var lines [][]byte
	eventually.True(t, 60*time.Second, "the poison in the DLQ and the other jobs done", func() bool {
		f.revive()
		if dl.MessageId == "" {
			d, ok, err := ch.Get(rabbitmq.NamesFor(queueName).DLQ, true)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				dl = d
			}
		}
		data, _ := os.ReadFile(ledger)
		lines = bytes.SplitAfter(data, []byte("\n"))
		return dl.MessageId != "" && len(othersIn(lines)) == others
	})
	f.stop()

	if dl.MessageId != "poison" || fmt.Sprint(dl.Headers[rabbitmq.HeaderReason]) != "crash_loop" {
		t.Errorf("the DLQ got %q with reason %v, want poison with crash_loop", dl.MessageId, dl.Headers[rabbitmq.HeaderReason])
	}
	runs, firstPoison, lastPoison, othersBetween := 0, -1, -1, 0
	for i, l := range lines {
		if bytes.HasPrefix(l, []byte("poison")) {
			runs++
			if firstPoison < 0 {
				firstPoison = i
			}
			lastPoison = i
		}
	}
	othersDone := othersIn(lines)
	for _, l := range lines[max(firstPoison, 0):max(lastPoison, 0)] {
		if !bytes.HasPrefix(l, []byte("poison")) {
			othersBetween++
		}
	}
	if runs != rabbitmq.DefaultMaxDeliveries {
		t.Errorf("the poison ran %d times, want %d (max deliveries)", runs, rabbitmq.DefaultMaxDeliveries)
	}
	if len(othersDone) != others {
		t.Errorf("%d of the %d other jobs done", len(othersDone), others)
	}
	// Not blocked: every other job finished (checked above). How many
	// finished while the poison went round depends on timing alone: a
	// quorum queue hands a returned message out again first, so the
	// worker that asks next may well take the poison at once.
	t.Logf("the poison ran %d times (%d worker starts); %d other jobs finished between its first and last run; dead letter error: %v",
		runs, f.starts, othersBetween, dl.Headers[rabbitmq.HeaderError])
}

// othersIn is the set of jobs other than the poison in the ledger lines.
func othersIn(lines [][]byte) map[string]bool {
	done := map[string]bool{}
	for _, l := range lines {
		if len(l) == ledgerLineLen && !bytes.HasPrefix(l, []byte("poison")) {
			done[string(l[:6])] = true
		}
	}
	return done
}
