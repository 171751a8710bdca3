package rabbitmq

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/backstop-dev/backstop/internal/testing/eventually"
)

// Issue 27: the DLQ workflow on RabbitMQ: delete and purge to the bounded
// audit queue Q.audit, replay by job id, paced replay.
func TestDLQWorkflow(t *testing.T) {
	b := shared.Broker(t)
	conn := b.Dial(t)
	ctx := context.Background()
	t.Run("DiscardToTheAudit", func(t *testing.T) { testDiscardToTheAudit(t, ctx, conn) })
	t.Run("ReplayByIDAndPaced", func(t *testing.T) { testReplayByIDAndPaced(t, ctx, conn) })
	t.Run("ReplayRecordedWithAnActor", func(t *testing.T) { testReplayRecordedWithAnActor(t, ctx, conn) })
	t.Run("LooksDoNotUseUpADeadLetter", func(t *testing.T) { testLooksDoNotUseUpADeadLetter(t, ctx, conn) })
}

// Issue 40: 25 inspects, and 25 replays that match nothing, leave the dead
// letters in place with their headers, and what inspect shows does not
// change. The DLQ is declared with x-delivery-limit 20, the default of
// RabbitMQ 4.x's quorum queues, which 3.10 to 4.2 compare with a count
// that every return raises (basic.nack, basic.reject, a closed channel:
// measured on 3.10.8): returned after each look, the dead letters were
// dropped at the 20th.
func testLooksDoNotUseUpADeadLetter(t *testing.T, ctx context.Context, conn *amqp.Connection) {
	ch, _ := conn.Channel()
	defer ch.Close()
	if _, err := ch.QueueDeclare("looked.dlq", true, false, false, false, amqp.Table{"x-queue-type": "quorum", "x-delivery-limit": int64(20)}); err != nil {
		t.Fatal(err)
	}
	ids := []string{"look-a", "look-b", "look-c"}
	for _, id := range ids {
		publishConfirmed(t, conn, "", "looked.dlq", deadLetter("looked", id, "permanent_error", 2))
	}
	first, err := inspectDeadLetters(ctx, conn, "looked", 10)
	if err != nil || len(first) != len(ids) {
		t.Fatalf("inspect: %d dead letters, %v", len(first), err)
	}
	want, _ := json.Marshal(first)
	for i := range 25 {
		got, err := inspectDeadLetters(ctx, conn, "looked", 10)
		if err != nil {
			t.Fatal(err)
		}
		if g, _ := json.Marshal(got); string(g) != string(want) {
			t.Fatalf("inspect %d shows\n %s\nthe first showed\n %s", i+2, g, want)
		}
		if _, err := replayDeadLetters(ctx, conn, "looked", ReplayOptions{Limit: 1, Reason: "transient"}); err != nil {
			t.Fatal(err)
		}
	}
	left := drain(t, conn, "looked.dlq")
	if len(left) != len(ids) {
		t.Fatalf("%d dead letters left of %d", len(left), len(ids))
	}
	for i, d := range left {
		n, _, _ := headerDigits(d.Headers["x-delivery-count"])
		if d.MessageId != ids[i] || headerString(d.Headers, HeaderReason) != "permanent_error" || headerString(d.Headers, HeaderError) == "" || n > refreshAt {
			t.Errorf("dead letter %d: %s, x-delivery-count %d, headers %v", i, d.MessageId, n, d.Headers)
		}
	}
}

func testDiscardToTheAudit(t *testing.T, ctx context.Context, conn *amqp.Connection) {
	ch, _ := conn.Channel()
	defer ch.Close()
	adminQueue(t, ch, "refunds", 7)
	other := deadLetter("refunds", "job-c", "permanent_error", 2)
	other.Headers["backstop-job-type"] = "charge_card"
	publishConfirmed(t, conn, "", "refunds.dlq",
		deadLetter("refunds", "job-a", "permanent_error", 3),
		deadLetter("refunds", "job-b", "malformed", 1),
		other,
		deadLetter("refunds", "job-d", "permanent_error", 1),
		deadLetter("refunds", "job-e", "permanent_error", 1))

	n, err := discardDeadLetters(ctx, conn, "refunds", DiscardOptions{Action: "delete", ID: "job-b", Note: "bad input", Actor: "ann@ops1"})
	if err != nil || n != 1 {
		t.Fatalf("delete job-b: %d %v", n, err)
	}
	n, err = discardDeadLetters(ctx, conn, "refunds", DiscardOptions{Action: "purge", Reason: "permanent_error", JobType: "send_email",
		Limit: 2, Note: "incident-7", Actor: "bob@ops2"})
	if err != nil || n != 2 {
		t.Fatalf("purge: %d %v", n, err)
	}
	eventually.True(t, 10*time.Second, "2 dead letters left, 3 in the audit", func() bool {
		return depthOf(t, conn, "refunds.dlq") == 2 && depthOf(t, conn, "refunds.audit") == 3
	})
	audit := drain(t, conn, "refunds.audit")
	want := []struct{ id, action, note, actor string }{
		{"job-b", "delete", "bad input", "ann@ops1"}, {"job-a", "purge", "incident-7", "bob@ops2"}, {"job-d", "purge", "incident-7", "bob@ops2"},
	}
	for i, w := range want {
		d := audit[i]
		at, _, _ := headerDigits(d.Headers[HeaderAuditAtMs])
		if d.MessageId != w.id || headerString(d.Headers, HeaderAuditAction) != w.action || headerString(d.Headers, HeaderAuditNote) != w.note ||
			headerString(d.Headers, HeaderAuditActor) != w.actor || at < time.Now().Add(-time.Minute).UnixMilli() ||
			headerString(d.Headers, HeaderReason) == "" || headerString(d.Headers, HeaderAttempt) == "" ||
			string(d.Body) != `{"to":"`+w.id+`"}` || d.ContentType != "application/json" {
			t.Errorf("audit %d: %s %v", i, d.MessageId, d.Headers)
		}
	}
	left, _ := inspectDeadLetters(ctx, conn, "refunds", 10)
	if len(left) != 2 || left[0].JobID+left[1].JobID != "job-cjob-e" && left[0].JobID+left[1].JobID != "job-ejob-c" {
		t.Errorf("left: %+v", left)
	}
	// The audit queue is bounded, oldest first out.
	ch2, _ := conn.Channel()
	defer ch2.Close()
	if _, err := ch2.QueueDeclare("refunds.audit", true, false, false, false, amqp.Table{
		"x-queue-type": "quorum", "x-max-length": int64(AuditMaxLength), "x-overflow": "drop-head"}); err != nil {
		t.Errorf("the audit queue is not declared with x-max-length %d, drop-head: %v", AuditMaxLength, err)
	}
	for _, o := range []DiscardOptions{
		{Action: "delete", Note: "x", Actor: "y"},
		{Action: "drop", Note: "x", Actor: "y"},
		{Action: "purge", Actor: "y"},
		{Action: "purge", Note: "x"},
		{Action: "purge", Note: "x", Actor: "y", Reason: "a b"},
	} {
		if _, err := discardDeadLetters(ctx, conn, "refunds", o); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
}

func testReplayByIDAndPaced(t *testing.T, ctx context.Context, conn *amqp.Connection) {
	ch, _ := conn.Channel()
	defer ch.Close()
	adminQueue(t, ch, "paced", 7)
	var msgs []amqp.Publishing
	for _, id := range []string{"job-a", "job-b", "job-c", "job-d", "job-e", "job-f", "job-g"} {
		msgs = append(msgs, deadLetter("paced", id, "transient", 2))
	}
	publishConfirmed(t, conn, "", "paced.dlq", msgs...)
	n, err := replayDeadLetters(ctx, conn, "paced", ReplayOptions{Limit: 10, ID: "job-c", KeepAttempts: true})
	if err != nil || n != 1 {
		t.Fatalf("replay job-c: %d %v", n, err)
	}
	jobs := drain(t, conn, "paced")
	if len(jobs) != 1 || jobs[0].MessageId != "job-c" || headerString(jobs[0].Headers, HeaderAttempt) != "2" {
		t.Fatalf("replayed: %v", jobs)
	}
	// 20/s: batches of 2 every 100 ms: 4 take at least 100 ms.
	start := time.Now()
	n, err = replayDeadLetters(ctx, conn, "paced", ReplayOptions{Limit: 4, Rate: 20})
	if err != nil || n != 4 {
		t.Fatalf("paced replay: %d %v", n, err)
	}
	if d := time.Since(start); d < 95*time.Millisecond {
		t.Errorf("4 at 20/s took %v, want >= 100ms", d)
	}
	// 0.1/s: the first batch at once, then the context (2 s) ends while it
	// waits 10 s;
	// the rest stays in the DLQ.
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	n, err = replayDeadLetters(cctx, conn, "paced", ReplayOptions{Limit: 2, Rate: 0.1})
	if n != 1 || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("replay at 0.1/s cancelled: %d %v; want 1 and the deadline", n, err)
	}
	eventually.True(t, 10*time.Second, "1 dead letter left, 5 jobs replayed", func() bool {
		return depthOf(t, conn, "paced.dlq") == 1 && depthOf(t, conn, "paced") == 5
	})
	if _, err := replayDeadLetters(ctx, conn, "paced", ReplayOptions{Limit: 1, Rate: -1}); err == nil {
		t.Error("rate -1: no error")
	}
}

// Issue 46: a replay given an actor records each dead letter it moves in
// Q.audit (action replay, actor, at-ms, job id, reason; no body), and one
// without records nothing.
func testReplayRecordedWithAnActor(t *testing.T, ctx context.Context, conn *amqp.Connection) {
	ch, _ := conn.Channel()
	defer ch.Close()
	adminQueue(t, ch, "replayaud", 3)
	publishConfirmed(t, conn, "", "replayaud.dlq", deadLetter("replayaud", "job-a", "transient", 2),
		deadLetter("replayaud", "job-b", "permanent_error", 1), deadLetter("replayaud", "job-c", "transient", 1))
	if n, err := replayDeadLetters(ctx, conn, "replayaud", ReplayOptions{Limit: 1, ID: "job-b"}); err != nil || n != 1 {
		t.Fatalf("replay job-b: %d %v", n, err)
	}
	if queueExists(conn, NamesFor("replayaud").Audit) {
		t.Fatal("a replay without an actor declared the audit queue")
	}
	n, err := replayDeadLetters(ctx, conn, "replayaud", ReplayOptions{Limit: 10, Reason: "transient", Actor: "ann@ops1"})
	if err != nil || n != 2 {
		t.Fatalf("replay: %d %v", n, err)
	}
	recs := drain(t, conn, NamesFor("replayaud").Audit)
	if len(recs) != 2 {
		t.Fatalf("audit: %d records, want 2", len(recs))
	}
	// In the order replayed: the first replay's looks may have put job-a
	// back behind job-c.
	seen := map[string]bool{}
	for i := range recs {
		h := recs[i].Headers
		seen[recs[i].MessageId] = true
		if headerString(h, HeaderAuditAction) != "replay" || headerString(h, HeaderAuditActor) != "ann@ops1" ||
			headerString(h, HeaderReason) != "transient" || headerString(h, HeaderAuditAtMs) == "" || len(recs[i].Body) != 0 {
			t.Errorf("audit record %d: %s %v body %q", i, recs[i].MessageId, h, recs[i].Body)
		}
	}
	if !seen["job-a"] || !seen["job-c"] {
		t.Errorf("audit records of %v, want job-a and job-c", seen)
	}
	if jobs := drain(t, conn, "replayaud"); len(jobs) != 3 {
		t.Errorf("replayed jobs: %d, want 3", len(jobs))
	}
}
