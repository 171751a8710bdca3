package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// Issue 13: the landing page shows what a user checks first, from a real
// Redis: the target, backstop_up, the number of queues and a link to each
// queue's figures; the link serves that queue's series and no other's.
func TestLandingPageShowsTheTargetUpAndQueues(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	for _, name := range []string{"orders", "emails"} {
		q := redisqueue.New(srv.Client(), name)
		if err := q.EnsureGroup(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := q.Enqueue(ctx, "job-1", nil); err != nil {
			t.Fatal(err)
		}
	}
	page := func(addr, path string) (int, string) {
		t.Helper()
		f, err := parse([]string{"--redis.addr=" + addr, "--queues=orders,emails"}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		rdb, err := f.redis.client()
		if err != nil {
			t.Fatal(err)
		}
		defer rdb.Close()
		logger := slog.New(slog.DiscardHandler)
		c, err := f.collector(rdb, logger)
		if err != nil {
			t.Fatal(err)
		}
		h, err := f.handler(c, logger)
		if err != nil {
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		return rec.Code, rec.Body.String()
	}

	code, body := page(srv.Addr, "/")
	for _, want := range []string{"<th>Redis</th><td>standalone " + srv.Addr + "</td>", "<th>backstop_up</th><td>1</td>",
		"<th>queues</th><td>2</td>", `<a href="queue?name=emails">emails</a>`, `<a href="queue?name=orders">orders</a>`, `href="/metrics"`} {
		if code != http.StatusOK || !strings.Contains(body, want) {
			t.Errorf("landing page: %d, no %q in\n%s", code, want, body)
		}
	}
	code, body = page(srv.Addr, "/queue?name=orders")
	if code != http.StatusOK || !strings.Contains(body, `backstop_enqueued_total{queue="orders"} 1`) || strings.Contains(body, `queue="emails"`) {
		t.Errorf("/queue?name=orders: %d\n%s", code, body)
	}
	if code, body := page(srv.Addr, "/queue?name=payments"); code != http.StatusNotFound || !strings.Contains(body, `no queue "payments"`) {
		t.Errorf("/queue?name=payments: %d %s", code, body)
	}

	srv.Stop()
	if code, body := page(srv.Addr, "/"); code != http.StatusOK || !strings.Contains(body, "<th>backstop_up</th><td>0</td>") {
		t.Errorf("landing page, Redis down: %d\n%s", code, body)
	}
}
