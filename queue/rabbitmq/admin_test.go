package rabbitmq

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/internal/testing/rabbittest"
)

// adminQueue declares q and q.dlq as the README's topology does (the
// parts Replay, Inspect and Stats read), with a small delivery limit.
func adminQueue(t *testing.T, ch *amqp.Channel, q string, deliveryLimit int) {
	t.Helper()
	if _, err := ch.QueueDeclare(NamesFor(q).DLQ, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum",
		"x-delivery-limit": int64(deliveryLimit), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": NamesFor(q).DLQ,
		"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}); err != nil {
		t.Fatal(err)
	}
}

// publishConfirmed publishes msgs to exchange/key and waits for every confirm.
func publishConfirmed(t *testing.T, conn *amqp.Connection, exchange, key string, msgs ...amqp.Publishing) {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	var dcs []*amqp.DeferredConfirmation
	for _, m := range msgs {
		dc, err := ch.PublishWithDeferredConfirm(exchange, key, false, false, m)
		if err != nil {
			t.Fatal(err)
		}
		dcs = append(dcs, dc)
	}
	for _, dc := range dcs {
		if !dc.Wait() {
			t.Fatal("publish nacked")
		}
	}
}

// deadLetter is a dead letter as a worker writes it.
func deadLetter(q, id, reason string, attempt int) amqp.Publishing {
	return amqp.Publishing{MessageId: id, DeliveryMode: amqp.Persistent, ContentType: "application/json",
		Body: []byte(`{"to":"` + id + `"}`), Headers: amqp.Table{
			"backstop-attempt": strconv.Itoa(attempt), "backstop-first-enqueued-ms": "1700000000000",
			"backstop-destination": q, "backstop-job-type": "send_email", "backstop-reason": reason,
			"backstop-error": "HTTP 400\nbad address", "backstop-dead-lettered-ms": "1700000001000",
			"backstop-last-reason": "transient", "backstop-last-error": "HTTP 503",
		}}
}

func depthOf(t *testing.T, conn *amqp.Connection, q string) int {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return st.Messages
}

// drain takes every message of q (acked) and returns them.
func drain(t *testing.T, conn *amqp.Connection, q string) []amqp.Delivery {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	return rabbittest.Drain(t, ch, q)
}

// The admin tests, on the package's shared broker, each on its own queues.
func TestAdmin(t *testing.T) {
	b := shared.Broker(t)
	conn := b.Dial(t)
	ctx := context.Background()

	t.Run("ReplayByReason", func(t *testing.T) { testReplayByReason(t, ctx, conn) })
	t.Run("CrashLoopByTheBroker", func(t *testing.T) { testCrashLoopByTheBroker(t, ctx, conn) })
	t.Run("Replay10000Limit100OriginalQueueOnly", func(t *testing.T) { testReplayBounded(t, ctx, conn) })
	t.Run("Stats", func(t *testing.T) { testStats(t, ctx, conn, b.ManagementURL()) })
	t.Run("BadOptions", func(t *testing.T) { testBadOptions(t, ctx, conn) })
	t.Run("StatsDelayed", func(t *testing.T) { testStatsDelayed(t, ctx, b.URL(), b.ManagementURL()) })
}

// DelayLevels counts the messages in the shared delay levels: a job due
// in 1 s has left them, one due in an hour has not, held by a mover or not. A vhost of its own, so
// that other tests' delays on the shared broker do not count.
func testStatsDelayed(t *testing.T, ctx context.Context, url, mgmtURL string) {
	for _, path := range []string{"/api/vhosts/delayed-stats", "/api/permissions/delayed-stats/guest"} {
		req, _ := http.NewRequest(http.MethodPut, mgmtURL+path, strings.NewReader(`{"configure":".*","write":".*","read":".*"}`))
		req.SetBasicAuth("guest", "guest")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode/100 != 2 {
			t.Fatalf("PUT %s: %v %v", path, resp, err)
		}
		resp.Body.Close()
	}
	br, err := Open(ctx, url+"delayed-stats")
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	q := br.Queue("later")
	if err := q.Enqueue(ctx, "soon", []byte("{}"), Delay(time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := q.Enqueue(ctx, "in-an-hour", []byte("{}"), Delay(time.Hour)); err != nil {
		t.Fatal(err)
	}
	// A mover (as every Work runs) moves them: soon arrives, the other is
	// held in hold.L10, unacked.
	mctx, stop := context.WithCancel(ctx)
	moved := make(chan struct{})
	go func() { defer close(moved); q.move(mctx) }()
	var s Stats
	eventually.True(t, 30*time.Second, "1 ready and 1 held in the delay levels (management API)", func() bool {
		s, err = q.Stats(ctx, WithManagementAPI(mgmtURL, nil))
		return err == nil && s.Ready == 1 && s.DelayLevels == 1 && s.Unacked != nil && *s.Unacked == 0
	})
	// Without the management API the held one is not seen; once the mover
	// stops, it waits in its level again, ready, and counts.
	if s, err = q.Stats(ctx); err != nil || s.DelayLevels != 0 {
		t.Errorf("Stats without the management API while held: %+v, %v; want 0 in the delay levels", s, err)
	}
	stop()
	<-moved
	eventually.True(t, 30*time.Second, "1 ready and 1 waiting in the delay levels", func() bool {
		s, err = q.Stats(ctx)
		return err == nil && s.Ready == 1 && s.DelayLevels == 1
	})
}

func testReplayByReason(t *testing.T, ctx context.Context, conn *amqp.Connection) {
	ch, _ := conn.Channel()
	defer ch.Close()
	adminQueue(t, ch, "orders", 7)
	noID := deadLetter("orders", "", "malformed", 1)
	publishConfirmed(t, conn, "", "orders.dlq",
		deadLetter("orders", "job-a", "permanent_error", 3),
		deadLetter("orders", "job-b", "max_attempts_reached", 5),
		noID,
		deadLetter("orders", "job-c", "permanent_error", 2),
		deadLetter("orders", "job-d", "malformed", 1))

	// Inspect is a peek: everything is shown, nothing leaves the DLQ.
	dls, err := inspectDeadLetters(ctx, conn, "orders", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 5 {
		t.Fatalf("inspect showed %d, want 5", len(dls))
	}
	eventually.True(t, 10*time.Second, "the 5 peeked dead letters back in the DLQ", func() bool { return depthOf(t, conn, "orders.dlq") == 5 })
	a := dls[0]
	if a.JobID != "job-a" || a.Attempt != "3" || a.Reason != "permanent_error" || a.Error != "HTTP 400\nbad address" ||
		a.JobType != "send_email" || a.FirstEnqueuedMs != 1700000000000 || a.DeadLetteredMs != 1700000001000 ||
		a.Payload != `{"to":"job-a"}` || a.PayloadSize != 14 || a.Headers["backstop-destination"] != "orders" {
		t.Errorf("inspect: %+v", a)
	}
	if dls2, _ := inspectDeadLetters(ctx, conn, "orders", 2); len(dls2) != 2 || dls2[0].JobID != "job-a" {
		t.Errorf("inspect 2 after a peek: %+v", dls2)
	}

	if n, err := replayDeadLetters(ctx, conn, "orders", ReplayOptions{Limit: 5, JobType: "charge_card"}); err != nil || n != 0 {
		t.Fatalf("replay of another job type: %d, %v; want 0", n, err)
	}
	n, err := replayDeadLetters(ctx, conn, "orders", ReplayOptions{Limit: 5, Reason: "permanent_error", JobType: "send_email"})
	if err != nil || n != 2 {
		t.Fatalf("replay permanent_error: %d, %v; want 2", n, err)
	}
	jobs := drain(t, conn, "orders")
	if len(jobs) != 2 {
		t.Fatalf("orders holds %d jobs, want 2", len(jobs))
	}
	for _, j := range jobs {
		if j.MessageId != "job-a" && j.MessageId != "job-c" {
			t.Errorf("replayed %q", j.MessageId)
		}
		fe, _ := strconv.ParseInt(headerString(j.Headers, "backstop-first-enqueued-ms"), 10, 64)
		if headerString(j.Headers, "backstop-attempt") != "1" || fe < time.Now().Add(-time.Minute).UnixMilli() ||
			headerString(j.Headers, "backstop-last-reason") != "permanent_error" || headerString(j.Headers, "backstop-job-type") != "send_email" ||
			string(j.Body) != `{"to":"`+j.MessageId+`"}` || j.ContentType != "application/json" || j.DeliveryMode != amqp.Persistent {
			t.Errorf("replayed job %s: %v", j.MessageId, j.Headers)
		}
		for _, gone := range []string{"backstop-reason", "backstop-error", "backstop-dead-lettered-ms", "backstop-last-error"} {
			if _, ok := j.Headers[gone]; ok {
				t.Errorf("replayed job %s keeps %s", j.MessageId, gone)
			}
		}
	}

	// Keep-attempts; the one without a job id stays, for a person.
	n, err = replayDeadLetters(ctx, conn, "orders", ReplayOptions{Limit: 10, KeepAttempts: true})
	if err != nil || n != 2 {
		t.Fatalf("replay any: %d, %v; want 2 (job-b, job-d)", n, err)
	}
	for _, j := range drain(t, conn, "orders") {
		if want := map[string]string{"job-b": "5", "job-d": "1"}[j.MessageId]; headerString(j.Headers, "backstop-attempt") != want ||
			headerString(j.Headers, "backstop-first-enqueued-ms") != "1700000000000" {
			t.Errorf("keep-attempts: job %s: %v", j.MessageId, j.Headers)
		}
	}
	left, _ := inspectDeadLetters(ctx, conn, "orders", 10)
	if len(left) != 1 || left[0].JobID != "" || left[0].Reason != "malformed" {
		t.Errorf("left in the DLQ: %+v, want the dead letter without a job id", left)
	}
}

// The broker dead-letters a message past x-delivery-limit with no
// backstop-reason: Inspect and Replay call it crash_loop.
func testCrashLoopByTheBroker(t *testing.T, ctx context.Context, conn *amqp.Connection) {
	ch, _ := conn.Channel()
	defer ch.Close()
	adminQueue(t, ch, "poison", 1)
	publishConfirmed(t, conn, "", "poison", amqp.Publishing{MessageId: "p-1", Body: []byte("boom"), Headers: amqp.Table{
		"backstop-attempt": "2", "backstop-first-enqueued-ms": "1700000000000", "backstop-destination": "poison"}})
	// A consumer that dies with the message twice (returned unacked).
	for i := 0; i < 2; i++ {
		d, ok, err := ch.Get("poison", false)
		if err != nil || !ok {
			t.Fatalf("get %d: %v %v", i, ok, err)
		}
		d.Nack(false, true)
	}
	eventually.True(t, 10*time.Second, "the broker dead-letters p-1", func() bool { return depthOf(t, conn, "poison.dlq") == 1 })
	dls, err := inspectDeadLetters(ctx, conn, "poison", 5)
	if err != nil || len(dls) != 1 {
		t.Fatalf("inspect: %v %v", dls, err)
	}
	if d := dls[0]; d.Reason != "crash_loop" || d.JobID != "p-1" || d.Attempt != "2" || d.DeadLetteredMs == 0 || !strings.Contains(d.Error, "x-delivery-limit") {
		t.Errorf("broker dead letter: %+v", d)
	}
	n, err := replayDeadLetters(ctx, conn, "poison", ReplayOptions{Limit: 1, Reason: "crash_loop"})
	if err != nil || n != 1 {
		t.Fatalf("replay crash_loop: %d %v", n, err)
	}
	jobs := drain(t, conn, "poison")
	if len(jobs) != 1 || headerString(jobs[0].Headers, "backstop-last-reason") != "crash_loop" || jobs[0].Headers["x-death"] != nil {
		t.Errorf("replayed poison: %v", jobs)
	}
}

// Issue 12's reliability figure: 10,000 dead letters, limit 100 moves
// exactly 100, to the original queue only. The jobs came through a topic
// exchange that also feeds another queue, and the broker dead-lettered
// them (x-death names that exchange): a replay that followed x-death
// would reach the other queue too.
func testReplayBounded(t *testing.T, ctx context.Context, conn *amqp.Connection) {
	ch, _ := conn.Channel()
	defer ch.Close()
	adminQueue(t, ch, "invoices", 7)
	if _, err := ch.QueueDeclare("audit", true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare("events", "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"invoices", "audit"} {
		if err := ch.QueueBind(q, "invoice.#", "events", false, nil); err != nil {
			t.Fatal(err)
		}
	}
	const total = 10_000
	msgs := make([]amqp.Publishing, total)
	for i := range msgs {
		msgs[i] = amqp.Publishing{MessageId: fmt.Sprintf("inv-%05d", i), DeliveryMode: amqp.Persistent, Body: []byte("{}"),
			Headers: amqp.Table{"backstop-attempt": "1", "backstop-first-enqueued-ms": "1700000000000"}}
	}
	publishConfirmed(t, conn, "events", "invoice.created", msgs...)
	// Every job rejected: the broker dead-letters it to invoices.dlq.
	ch.Qos(1000, 0, false)
	ds, err := ch.Consume("invoices", "rejecter", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < total; i++ {
		d := <-ds
		d.Nack(false, false)
	}
	ch.Cancel("rejecter", false)
	eventually.True(t, 60*time.Second, "10,000 dead letters", func() bool { return depthOf(t, conn, "invoices.dlq") == total })
	if _, err := ch.QueuePurge("audit", false); err != nil {
		t.Fatal(err)
	}

	n, err := replayDeadLetters(ctx, conn, "invoices", ReplayOptions{Limit: 100})
	if err != nil || n != 100 {
		t.Fatalf("replay --limit 100: %d, %v", n, err)
	}
	if got := depthOf(t, conn, "invoices"); got != 100 {
		t.Errorf("invoices holds %d, want 100", got)
	}
	// Acks are settled by the queue after the call returns.
	if err := eventually.Wait(30*time.Second, func() bool { return depthOf(t, conn, "invoices.dlq") == total-100 }); err != nil {
		left := drain(t, conn, "invoices.dlq")
		ids := map[string]int{}
		for _, d := range left {
			ids[d.MessageId]++
		}
		var dups []string
		for id, n := range ids {
			if n > 1 {
				dups = append(dups, id)
			}
		}
		t.Fatalf("invoices.dlq holds %d (%d distinct), want %d; duplicated: %v", len(left), len(ids), total-100, dups)
	}
	if got := depthOf(t, conn, "audit"); got != 0 {
		t.Errorf("audit (bound to the same topic exchange) received %d, want 0", got)
	}
	ids := map[string]bool{}
	for _, d := range drain(t, conn, "invoices") {
		ids[d.MessageId] = true
		if headerString(d.Headers, "backstop-last-reason") != "rejected" {
			t.Fatalf("replayed %s: last reason %v, want the broker's (rejected)", d.MessageId, d.Headers["backstop-last-reason"])
		}
	}
	if len(ids) != 100 {
		t.Errorf("%d distinct jobs replayed, want 100", len(ids))
	}
}

func testStats(t *testing.T, ctx context.Context, conn *amqp.Connection, mgmtURL string) {
	ch, _ := conn.Channel()
	defer ch.Close()
	adminQueue(t, ch, "stats", 7)
	publishConfirmed(t, conn, "", "stats", deadLetter("stats", "s-1", "", 1), deadLetter("stats", "s-2", "", 1), deadLetter("stats", "s-3", "", 1))
	publishConfirmed(t, conn, "", "stats.dlq", deadLetter("stats", "d-1", "permanent_error", 1))
	held, ok, err := ch.Get("stats", false) // one unacked
	if err != nil || !ok {
		t.Fatal(err)
	}
	defer held.Ack(false)
	s, err := queueStats(ctx, conn, "stats")
	if err != nil || s.Ready != 2 || s.DLQ != 1 || s.Unacked != nil {
		t.Fatalf("stats: %+v, %v", s, err)
	}
	// The management API refreshes its figures every few seconds.
	eventually.True(t, 30*time.Second, "1 unacked through the management API", func() bool {
		s, err = queueStats(ctx, conn, "stats", WithManagementAPI(mgmtURL, nil))
		return err == nil && s.Unacked != nil && *s.Unacked == 1
	})
	if _, err := queueStats(ctx, conn, "nope"); err == nil || !strings.Contains(err.Error(), `no queue "nope"`) {
		t.Errorf("stats of a missing queue: %v", err)
	}
}

func testBadOptions(t *testing.T, ctx context.Context, conn *amqp.Connection) {
	for _, c := range []struct {
		o    ReplayOptions
		want string
	}{
		{ReplayOptions{}, "limit must be at least 1, got 0"},
		{ReplayOptions{Limit: 1, Reason: "max attempts"}, `reason must be "" (any) or 1..128 printable ASCII characters without spaces, got "max attempts"`},
		{ReplayOptions{Limit: 10, Scan: 5}, "scan must be in 10..100000"},
	} {
		if _, err := replayDeadLetters(ctx, conn, "orders", c.o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.o, err, c.want)
		}
	}
	if _, err := inspectDeadLetters(ctx, conn, "orders", -1); err == nil || !strings.Contains(err.Error(), "n must be in 0..100000") {
		t.Errorf("inspect -1: %v", err)
	}
}
