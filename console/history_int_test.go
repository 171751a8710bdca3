package console_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/backstop-dev/backstop/console"
	"github.com/backstop-dev/backstop/exporter"
	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/internal/testing/promtest"
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
			s := serve(t, b.Kind(), []queue.Queue{q}, console.WithExporter(collector(q.Name()), time.Second), withPreset(t, "default"))

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
			run(t, bctx, "overview", chromedp.Navigate(s.srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#history")))
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

// With a Prometheus (a real one, scraping the exporter's collector every
// second) the overview's last hour is Prometheus's rate() and increase():
// the figures move once jobs retry and dead-letter, and the console's own
// history is not used (WithExporter is ignored).
func TestOverviewFromPrometheus(t *testing.T) {
	b, rdb := openRedis(t)
	q, err := b.Open("ledger")
	if err != nil {
		t.Fatal(err)
	}
	col, err := exporter.NewCollector(rdb, exporter.WithQueues(exporter.QueueFor("ledger")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { col.Close() })
	reg := prometheus.NewRegistry()
	reg.MustRegister(col)
	metrics := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(metrics.Close)
	prom := promtest.Start(t, strings.TrimPrefix(metrics.URL, "http://"))

	s := serve(t, b.Kind(), []queue.Queue{q}, console.WithPrometheus("http://"+prom), console.WithExporter(col, time.Second))

	ctx := context.Background()
	enqueue := func(from, to int) {
		for i := from; i < to; i++ {
			if _, err := q.Enqueue(ctx, fmt.Sprintf("l-%d", i), []byte(`{}`), queue.EnqueueOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	stop := work(t, q, `{"max_attempts": 2, "backoff": {"strategy": "constant", "base": "1s", "cap": "1s"}, "jitter": {"mode": "none"}}`,
		func(context.Context, queue.Job) error { return errors.New("upstream answered 503") })
	defer stop()
	// rate() and increase() count from a series' first sample: the first
	// jobs make the retry series, Prometheus scrapes them, and the next
	// jobs move them.
	enqueue(0, 2)
	eventually.True(t, 60*time.Second, "Prometheus holds the first retries and dead letters", func() bool {
		return promHas(t, prom, `backstop_retries_total{queue="ledger"} > 0`) && promHas(t, prom, `backstop_dlq_ingested_total{queue="ledger"} >= 2`)
	})
	enqueue(2, 4)
	cells := regexp.MustCompile(`<td class="retries">([^<]*)</td><td class="ingested">([^<]*)</td>`)
	var body string
	var m []string
	if err := eventually.Wait(60*time.Second, func() bool {
		_, body = s.get("/")
		if m = cells.FindStringSubmatch(body); m == nil {
			return false
		}
		r, err1 := strconv.ParseFloat(m[1], 64)
		n, err2 := strconv.ParseFloat(m[2], 64)
		return err1 == nil && err2 == nil && r > 0 && n > 0
	}); err != nil {
		t.Fatalf("waiting for Prometheus's figures to move: %q: %v\n%s", m, err, body)
	}
	mustNotContain(t, "overview", body, `id="history"`, "sampled by the console")
}

// promHas reports whether an instant query of the Prometheus at addr has
// a result.
func promHas(t *testing.T, addr, query string) bool {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/api/v1/query?query=" + url.QueryEscape(query))
	if err != nil {
		return false
	}
	var body struct {
		Data struct {
			Result []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	err = json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	return err == nil && len(body.Data.Result) > 0
}
