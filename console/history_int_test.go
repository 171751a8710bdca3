package console_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/backstop-dev/backstop/console"
	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/queue"
)

// Without a Prometheus the overview's last hour comes from the console's
// own samples of the exporter's readers: a queue whose jobs retry and
// dead-letter sees its retry rate and DLQ ingestion move from 0, and the
// page says since when it has samples (not a whole hour). Then chromium
// shows the same figures.
func TestOverviewHistoryWithoutPrometheus(t *testing.T) {
	cells := regexp.MustCompile(`<td class="retries">([^<]*)</td><td class="ingested">([^<]*)</td>`)
	for _, br := range brokers {
		t.Run(br.name, func(t *testing.T) {
			b, collector := br.withExporter(t)
			name := "billing"
			if b.Kind() != "redis" {
				name += "-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 10)
			}
			q, err := b.Open(name)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			const jobs = 4
			for i := range jobs { // declares the queue; no worker yet
				if _, err := q.Enqueue(ctx, fmt.Sprintf("b-%d", i), []byte(`{"amount":1}`), queue.EnqueueOptions{Type: "charge"}); err != nil {
					t.Fatal(err)
				}
			}
			h, err := console.New(b.Kind(), []queue.Queue{q}, quiet, console.WithExporter(collector(q.Name()), time.Second),
				withPreset(t, "default"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { h.Close() })
			srv := httptest.NewServer(h)
			t.Cleanup(srv.Close)
			s := &site{t: t, srv: srv}

			figures := func() (retries, ingested, body string) {
				_, body = s.get("/")
				m := cells.FindStringSubmatch(body)
				if m == nil {
					t.Fatalf("overview without the last hour's figures:\n%s", body)
				}
				return m[1], m[2], body
			}
			var retries, ingested, body string
			if err := eventually.Wait(30*time.Second, func() bool {
				retries, ingested, body = figures()
				return ingested == "0" && strings.TrimPrefix(retries, "≤ ") == "0"
			}); err != nil {
				t.Fatalf("waiting for two samples (the figures at 0): retries %q, ingested %q: %v\n%s", retries, ingested, err, body)
			}
			mustContain(t, "overview", body, `id="history"`, "sampled by the console", "every 1s", "since ", "of the last hour, not a whole hour")
			mustNotContain(t, "overview", body, "the last hour.")

			// Each job fails twice: one retry a second later, then the DLQ.
			stop := work(t, q, `{"max_attempts": 2, "backoff": {"strategy": "constant", "base": "1s", "cap": "1s"}, "jitter": {"mode": "none"}}`,
				func(context.Context, queue.Job) error { return errors.New("upstream answered 503") })
			defer stop()
			if n := dlqSize(t, q, jobs); n != jobs {
				t.Fatalf("DLQ %d, want %d", n, jobs)
			}
			if err := eventually.Wait(60*time.Second, func() bool {
				retries, ingested, body = figures()
				r, err := strconv.ParseFloat(strings.TrimPrefix(retries, "≤ "), 64)
				return ingested == strconv.Itoa(jobs) && err == nil && r > 0
			}); err != nil {
				t.Fatalf("waiting for the figures to move: retries %q, ingested %q: %v", retries, ingested, err)
			}
			if b.Kind() == "rabbitmq" {
				// RabbitMQ counts what entered the delay, not retries.
				if !strings.HasPrefix(retries, "≤ ") {
					t.Errorf("RabbitMQ retries %q, want an upper bound", retries)
				}
				mustContain(t, "overview", body, "RabbitMQ does not count retries")
			}

			bctx := browser(t)
			run(t, bctx, "overview", chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#history")))
			if got := text(t, bctx, "td.ingested"); got != strconv.Itoa(jobs) {
				t.Errorf("chromium: DLQ ingested %q, want %d", got, jobs)
			}
			// The rate falls as the samples' span grows: a figure above 0.
			if got, err := strconv.ParseFloat(strings.TrimPrefix(text(t, bctx, "td.retries"), "≤ "), 64); err != nil || got <= 0 {
				t.Errorf("chromium: retries %v, %v; want a rate above 0", got, err)
			}
			if got := text(t, bctx, "#history"); !strings.Contains(got, "since") {
				t.Errorf("chromium: the history note %q", got)
			}
			if b.Kind() == "redis" {
				shoot(t, bctx, "console-overview.png")
			}
		})
	}
}
