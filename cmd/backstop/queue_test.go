package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

func TestDLQInspectReplayAndStats(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	q := redisqueue.New(rdb, "orders")
	q.EnsureGroup(ctx)
	for i, reason := range []string{"permanent_error", "max_attempts_reached", "permanent_error"} {
		q.Enqueue(ctx, "job-"+string(rune('a'+i)), []byte("{}"))
		msgs, _ := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "workers", Consumer: "c", Streams: []string{q.Keys().Jobs, ">"}, Count: 1}).Result()
		q.DeadLetter(ctx, msgs[0].Messages[0].ID, reason, "HTTP 4xx\nwith a body")
	}
	url := "--redis.url=redis://" + srv.Addr + "/0"

	out, err := runCLI(t, "", "dlq", "inspect", "--queue", "orders", url)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"queue orders: 3 dead letters", "permanent_error       2", "max_attempts_reached  1", "job-c", "HTTP 4xx with a body"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect lacks %q:\n%s", want, out)
		}
	}
	out, err = runCLI(t, "", "dlq", "replay", "--queue", "orders", "--limit", "5", "--reason", "permanent_error", url)
	if err != nil || !strings.Contains(out, "replayed 2 dead letters") {
		t.Fatalf("replay: %v\n%s", err, out)
	}
	out, err = runCLI(t, "", "queue", "stats", "--queue", "orders", url)
	if err != nil || !strings.Contains(out, "queue orders: 2 jobs (0 pending), 0 delayed, 1 dead letters") || !strings.Contains(out, "replayed") {
		t.Fatalf("stats: %v\n%s", err, out)
	}
	if _, err := runCLI(t, "", "dlq", "replay", "--queue", "orders", url); !errors.Is(err, errUsage) {
		t.Errorf("replay without --limit: %v", err)
	}
	if _, err := runCLI(t, "", "queue", "stats", url); !errors.Is(err, errUsage) {
		t.Errorf("stats without --queue: %v", err)
	}
}

// Issue 15 (class of item 11): dlq inspect --newest came back in one reply
// however many were asked for; it is bounded, and --scan is not negative.
// Both are checked before Redis is asked anything (nothing listens on port 1).
func TestDLQInspectBoundsItsFlags(t *testing.T) {
	for _, c := range []struct{ flag, value, want string }{
		{"--newest", "1001", "--newest: must be in 0..1000 (got 1001)"},
		{"--newest", "100000000", "--newest: must be in 0..1000 (got 100000000)"},
		{"--newest", "-1", "--newest: must be in 0..1000 (got -1)"},
		{"--scan", "-1", "--scan: must be >= 0 (got -1)"},
	} {
		_, err := runCLI(t, "", "dlq", "inspect", "--queue", "orders", c.flag, c.value, "--redis.url", "redis://127.0.0.1:1/0")
		if err == nil || err.Error() != c.want {
			t.Errorf("%s %s: %v, want %s", c.flag, c.value, err, c.want)
		}
	}
}

// Issue 27: dlq delete, dlq purge (recorded in {Q}:audit, counted) and
// dlq replay --id --keep-attempts --rate on Redis.
func TestDLQDiscardAndReplayByID(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	q := redisqueue.New(rdb, "orders")
	q.EnsureGroup(ctx)
	for i, reason := range []string{"permanent_error", "malformed", "permanent_error", "transient"} {
		q.Enqueue(ctx, "job-"+string(rune('a'+i)), []byte("{}"))
		msgs, _ := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "workers", Consumer: "c", Streams: []string{q.Keys().Jobs, ">"}, Count: 1}).Result()
		q.DeadLetter(ctx, msgs[0].Messages[0].ID, reason, "boom")
	}
	url := "--redis.url=redis://" + srv.Addr + "/0"
	out, err := runCLI(t, "", "dlq", "delete", "--queue", "orders", "--id", "job-b", "--reason", "bad input", url)
	if err != nil || !strings.Contains(out, "discarded 1 dead letters of queue orders (recorded in {orders}:audit)") {
		t.Fatalf("delete: %v\n%s", err, out)
	}
	if _, err := runCLI(t, "", "dlq", "delete", "--queue", "orders", "--id", "job-b", "--reason", "again", url); err == nil {
		t.Error("delete of a job with no dead letter: no error")
	}
	out, err = runCLI(t, "", "dlq", "purge", "--queue", "orders", "--reason", "incident-7", "--dead-letter-reason", "permanent_error", "--limit", "1", url)
	if err != nil || !strings.Contains(out, "discarded 1 dead letters") {
		t.Fatalf("purge: %v\n%s", err, out)
	}
	audit, _ := rdb.XRange(ctx, "{orders}:audit", "-", "+").Result()
	if len(audit) != 2 || audit[0].Values["action"] != "delete" || audit[0].Values["note"] != "bad input" ||
		audit[1].Values["action"] != "purge" || audit[1].Values["id"] != "job-a" || !strings.Contains(audit[1].Values["actor"].(string), "@") {
		t.Errorf("audit: %v", audit)
	}
	if v := rdb.HGet(ctx, q.Keys().Stats, "discarded").Val(); v != "2" {
		t.Errorf("discarded = %q", v)
	}
	out, err = runCLI(t, "", "dlq", "replay", "--queue", "orders", "--id", "job-d", "--keep-attempts", "--rate", "10/s", url)
	if err != nil || !strings.Contains(out, "replayed 1 dead letters of queue orders to {orders}:jobs (attempt count kept)") {
		t.Fatalf("replay --id: %v\n%s", err, out)
	}
	// The replay is in the audit with its actor (issue 46).
	audit, _ = rdb.XRange(ctx, "{orders}:audit", "-", "+").Result()
	if len(audit) != 3 || audit[2].Values["action"] != "replay" || audit[2].Values["id"] != "job-d" ||
		audit[2].Values["actor"] != actor() || !strings.Contains(actor(), "@") {
		t.Errorf("audit after the replay: %v", audit)
	}
	if _, err := runCLI(t, "", "dlq", "replay", "--queue", "orders", "--id", "job-d", url); err == nil {
		t.Error("replay --id of a job with no dead letter: no error")
	}
	for _, args := range [][]string{
		{"dlq", "purge", "--queue", "orders", url},
		{"dlq", "delete", "--queue", "orders", "--reason", "x", url},
		{"dlq", "replay", "--queue", "orders", "--limit", "1", "--rate", "fast", url},
	} {
		if _, err := runCLI(t, "", args...); !errors.Is(err, errUsage) {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
}
