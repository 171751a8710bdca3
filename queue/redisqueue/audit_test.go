package redisqueue_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// Issue 46: a replay or a force run given an actor records each job it
// moved in {Q}:audit (action, actor, at_ms, id, reason), as a discard
// does, and the broker's Audit reads them back; without an actor (the
// SDKs' replays) nothing is recorded.
func TestReplayAndRunRecordInTheAudit(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	q := redisqueue.New(rdb, "aud")
	deadLetters(t, ctx, rdb, q,
		[3]string{"a", "permanent_error", "send_email"}, [3]string{"b", "malformed", ""}, [3]string{"c", "permanent_error", ""})

	// No actor: replayed, not recorded.
	if n, err := q.ReplayDeadLetters(ctx, redisqueue.ReplayOptions{ID: "c"}); err != nil || n != 1 {
		t.Fatalf("replay c: %d %v", n, err)
	}
	if l := rdb.XLen(ctx, q.AuditKey()).Val(); l != 0 {
		t.Fatalf("a replay without an actor wrote %d audit records", l)
	}
	n, err := q.ReplayDeadLetters(ctx, redisqueue.ReplayOptions{Limit: 10, Reason: "permanent_error", Actor: "ann@ops1"})
	if err != nil || n != 1 {
		t.Fatalf("replay: %d %v", n, err)
	}
	audit := xrange(t, ctx, rdb, q.AuditKey())
	if len(audit) != 1 {
		t.Fatalf("audit after the replay: %v", audit)
	}
	f := fieldsOf(audit[0])
	if f["action"] != "replay" || f["actor"] != "ann@ops1" || f["id"] != "a" || f["reason"] != "permanent_error" ||
		f["type"] != "send_email" || len(f["at_ms"]) != 13 || f["dlq_entry"] == "" {
		t.Errorf("replay record %v", f)
	}

	// A force run of a delayed job, recorded as run with its last reason.
	delayJobs(t, ctx, rdb, q, time.Hour, "d")
	r, err := q.Run(ctx, redisqueue.RunID("d"), redisqueue.RunActor("bob@ops2"))
	if err != nil || r.Moved != 1 {
		t.Fatalf("run d: %+v %v", r, err)
	}
	audit = xrange(t, ctx, rdb, q.AuditKey())
	if len(audit) != 2 {
		t.Fatalf("audit after the run: %v", audit)
	}
	if f := fieldsOf(audit[1]); f["action"] != "run" || f["actor"] != "bob@ops2" || f["id"] != "d" || f["reason"] != "transient" || len(f["at_ms"]) != 13 {
		t.Errorf("run record %v", f)
	}

	// Through the broker interface, newest first.
	bq, err := redisqueue.NewBroker(rdb).Open("aud")
	if err != nil {
		t.Fatal(err)
	}
	recs, err := bq.Audit(ctx, 10)
	if err != nil || len(recs) != 2 {
		t.Fatalf("Audit: %v %v", recs, err)
	}
	if recs[0].Action != queue.AuditRun || recs[0].Actor != "bob@ops2" || recs[0].JobID != "d" ||
		recs[1].Action != queue.AuditReplay || recs[1].Actor != "ann@ops1" || recs[1].JobID != "a" || recs[1].At.IsZero() {
		t.Errorf("Audit: %+v", recs)
	}
	// An actor too long is refused before Redis.
	long := strings.Repeat("x", queue.MaxActorLen+1)
	if _, err := q.ReplayDeadLetters(ctx, redisqueue.ReplayOptions{Limit: 1, Actor: long}); err == nil {
		t.Error("a 257-byte actor was taken by replay")
	}
	if _, err := q.Run(ctx, redisqueue.RunID("d"), redisqueue.RunActor(long)); err == nil {
		t.Error("a 257-byte actor was taken by run")
	}
}
