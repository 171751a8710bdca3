package alerter

import (
	"context"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// TestAlerterOnEmbeddedServer: the embedded server of `backstop demo`
// reports no entries-added, and the alerter pages on the dead letters the
// queue scripts wrote instead of reading a constant 0. A DLQ written by
// something else cannot be watched there: the alerter says so once, and
// pages nothing for it.
func TestAlerterOnEmbeddedServer(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	am := newFakeAM(t)
	a, logs := newTestAlerter(t, rdb, am.URL)

	q := redisqueue.New(rdb, "orders")
	must(t, q.EnsureGroup(ctx))
	deadLetterJob := func(id string) {
		t.Helper()
		_, err := q.Enqueue(ctx, id, nil)
		must(t, err)
		m := readGroup(t, rdb, q.Keys().Jobs, "workers", 1)
		deadLetter(t, q, m[0].ID, "permanent_error")
	}
	deadLetterJob("old") // before the baseline: it must not page
	addDeadLetter(t, rdb, "emails")

	a.tick(ctx)
	a.tick(ctx)
	if got := am.all(); len(got) != 0 {
		t.Fatalf("posted on the baseline: %+v", got)
	}
	deadLetterJob("new-1")
	deadLetterJob("new-2")
	addDeadLetter(t, rdb, "emails")
	a.tick(ctx)
	posts := am.all()
	if len(posts) != 1 || posts[0].Labels["queue"] != "orders" {
		t.Fatalf("posts %+v, want one alert for orders", posts)
	}
	if got := posts[0].Annotations["description"]; !strings.Contains(got, "dead-lettered 2 jobs") {
		t.Errorf("description %q does not count the 2 new dead letters", got)
	}
	if n := strings.Count(logs.String(), "alerter cannot watch dlq"); n != 1 || !strings.Contains(logs.String(), "queue=emails") {
		t.Errorf("want one warning about emails, got:\n%s", logs)
	}
}
