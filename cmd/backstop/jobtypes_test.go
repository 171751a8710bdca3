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

// Job types from the command line: enqueue with --type, dlq inspect shows
// the type, dlq replay --type moves only that type, queue stats and queue
// types list the per-type figures, queue types --limit sets the limit.
func TestQueueJobTypesCLI(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	url := "--redis.url=redis://" + srv.Addr + "/0"
	q := redisqueue.New(rdb, "shop")
	if err := q.EnsureGroup(ctx); err != nil {
		t.Fatal(err)
	}
	for i, typ := range []string{"charge_card", "send_email", "charge_card", ""} {
		args := []string{"queue", "enqueue", "--queue", "shop", "--id", "job-" + string(rune('a'+i)), "--payload", "{}", url}
		if typ != "" {
			args = append(args, "--type", typ)
		}
		out, err := runCLI(t, "", args...)
		if err != nil || !strings.Contains(out, "enqueued job") {
			t.Fatalf("enqueue %s: %v\n%s", typ, err, out)
		}
	}
	if _, err := runCLI(t, "", "queue", "enqueue", "--queue", "shop", "--id", "x", "--type", "a:b", url); !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "--type") {
		t.Fatalf("enqueue --type a:b: %v", err)
	}
	msgs, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "workers", Consumer: "c", Streams: []string{q.Keys().Jobs, ">"}, Count: 10}).Result()
	if err != nil || len(msgs[0].Messages) != 4 {
		t.Fatalf("read: %v %v", msgs, err)
	}
	for _, m := range msgs[0].Messages {
		if _, err := q.DeadLetter(ctx, m.ID, "permanent_error", "HTTP 400"); err != nil {
			t.Fatal(err)
		}
	}

	out, err := runCLI(t, "", "dlq", "inspect", "--queue", "shop", url)
	if err != nil || !strings.Contains(out, "type") || !strings.Contains(out, "charge_card") || !strings.Contains(out, "send_email") {
		t.Fatalf("inspect: %v\n%s", err, out)
	}
	out, err = runCLI(t, "", "queue", "stats", "--queue", "shop", url)
	if err != nil || !strings.Contains(out, "job types: 2 counted by name (limit 50)") || !strings.Contains(out, "charge_card  0        0      0         2") {
		t.Fatalf("stats: %v\n%s", err, out)
	}
	if strings.Contains(out, "t:charge_card") {
		t.Fatalf("stats lists the per-type fields as queue counters:\n%s", out)
	}
	out, err = runCLI(t, "", "dlq", "replay", "--queue", "shop", "--limit", "10", "--type", "charge_card", url)
	if err != nil || !strings.Contains(out, "replayed 2 dead letters") {
		t.Fatalf("replay --type: %v\n%s", err, out)
	}
	if n, _ := rdb.XLen(ctx, q.Keys().DLQ).Result(); n != 2 {
		t.Fatalf("%d dead letters left, want 2", n)
	}
	if _, err := runCLI(t, "", "dlq", "replay", "--queue", "shop", "--limit", "10", "--type", "a b", url); !errors.Is(err, errUsage) {
		t.Fatalf("replay --type 'a b': %v", err)
	}
	out, err = runCLI(t, "", "queue", "types", "--queue", "shop", "--limit", "7", url)
	if err != nil || !strings.Contains(out, "job types: 2 counted by name (limit 7)") {
		t.Fatalf("types --limit 7: %v\n%s", err, out)
	}
	if _, err := runCLI(t, "", "queue", "types", "--queue", "shop", "--limit", "0", url); !errors.Is(err, errUsage) {
		t.Fatalf("types --limit 0: %v", err)
	}
}
