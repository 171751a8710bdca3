package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// backstop queue run moves one delayed job by id, or a bounded batch due
// before a time; an unknown id is an error that says so; the flags are
// checked before Redis.
func TestQueueRun(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	q := redisqueue.New(rdb, "orders")
	q.EnsureGroup(ctx)
	for i, id := range []string{"a", "b", "c", "d"} {
		q.Enqueue(ctx, id, []byte("{}"))
		msgs, _ := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "workers", Consumer: "c", Streams: []string{q.Keys().Jobs, ">"}, Count: 1}).Result()
		if _, _, err := q.Retry(ctx, msgs[0].Messages[0].ID, time.Duration(i+1)*time.Hour, "transient", "503"); err != nil {
			t.Fatal(err)
		}
	}
	url := "--redis.url=redis://" + srv.Addr + "/0"

	out, err := runCLI(t, "", "queue", "run", "--queue", "orders", "--id", "c", url)
	if err != nil || !strings.Contains(out, `moved job "c" of queue orders from {orders}:delayed to {orders}:jobs`) {
		t.Fatalf("run --id c: %v\n%s", err, out)
	}
	_, err = runCLI(t, "", "queue", "run", "--queue", "orders", "--id", "zz", url)
	if err == nil || !strings.Contains(err.Error(), `no delayed job with id "zz" in {orders}:delayed, nothing moved`) {
		t.Fatalf("run of an unknown id: %v", err)
	}
	before := time.Now().Add(150 * time.Minute).UTC().Format(time.RFC3339) // a and b
	out, err = runCLI(t, "", "queue", "run", "--queue", "orders", "--all-due-before", before, "--limit", "1", "--json", url)
	if err != nil || strings.TrimSpace(out) != `{"left":1,"moved":1,"queue":"orders"}` {
		t.Fatalf("run --all-due-before --limit 1 --json: %v\n%s", err, out)
	}
	out, err = runCLI(t, "", "queue", "run", "--queue", "orders", "--all-due-before", before, "--limit", "10", url)
	if err != nil || !strings.Contains(out, "moved 1 delayed jobs of queue orders to {orders}:jobs; 0 more due before") {
		t.Fatalf("run the rest: %v\n%s", err, out)
	}
	if s, _ := q.Stats(ctx); s.Counters["force_run"] != 3 {
		t.Fatalf("force_run = %d, want 3", s.Counters["force_run"])
	}
	// Each run is in the audit with its actor (issue 46): c, then a and b.
	audit, _ := rdb.XRange(ctx, q.AuditKey(), "-", "+").Result()
	if len(audit) != 3 {
		t.Fatalf("audit: %v", audit)
	}
	for i, id := range []string{"c", "a", "b"} {
		if v := audit[i].Values; v["action"] != "run" || v["id"] != id || v["actor"] != actor() {
			t.Errorf("audit record %d: %v, want run of %s by %s", i, v, id, actor())
		}
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--all-due-before", "now", "--limit", "10001"}, "--limit must be in 1..10000"},
		{[]string{"--all-due-before", "now", "--limit", "0"}, "--limit must be in 1..10000"},
		{[]string{"--all-due-before", "now"}, "--limit must be in 1..10000"},
		{[]string{"--all-due-before", "tomorrow", "--limit", "5"}, "--all-due-before must be an RFC 3339 time"},
		{[]string{"--id", "a", "--all-due-before", "now", "--limit", "5"}, "give --id or --all-due-before"},
		{[]string{}, "give --id or --all-due-before"},
		{[]string{"--id", "a", "--limit", "5"}, "--limit goes with --all-due-before"},
	} {
		// Nothing listens on port 1: these never reach Redis.
		_, err := runCLI(t, "", append([]string{"queue", "run", "--queue", "orders", "--redis.url=redis://127.0.0.1:1/0"}, c.args...)...)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("queue run %v: %v, want a usage error with %q", c.args, err, c.want)
		}
	}
}
