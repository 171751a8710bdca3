package e2e

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/exporter"
	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// TestEveryNamedMetricIsEmitted parses every rule and panel expression
// with the PromQL parser and proves each metric it names is in a real
// scrape of the exporter over a queue that has seen every outcome, or, for
// the process metrics (backstop_client_*), in a real scrape of a service
// whose retry loop has seen every outcome (startService), and for the
// idempotency metrics (backstop_idempotency_*), in a real scrape of a
// service behind the Go middleware (startIdempotentService). The queue's
// jobs are typed (charge_card fails, send_email does not) and untyped, so
// the per-type series are in the scrape.
func TestEveryNamedMetricIsEmitted(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	q := redisqueue.New(rdb, "orders")
	q.EnsureGroup(ctx)
	types := []string{"send_email", "charge_card", "charge_card", "", ""}
	for i, outcome := range []string{"ack", "retry", "dead", "retry-due", "pending"} {
		if _, err := q.Enqueue(ctx, "job-"+outcome, []byte("{}"), redisqueue.WithJobType(types[i])); err != nil {
			t.Fatal(err)
		}
		res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: q.Group(), Consumer: "c", Streams: []string{q.Keys().Jobs, ">"}, Count: 1}).Result()
		if err != nil {
			t.Fatal(err)
		}
		id := res[0].Messages[0].ID
		switch i {
		case 0:
			q.Ack(ctx, id)
		case 1:
			q.Retry(ctx, id, time.Hour, "retry_after", "429")
		case 2:
			q.DeadLetter(ctx, id, "max_attempts_reached", "503")
		case 3:
			q.Retry(ctx, id, 0, "transient", "503")
		}
	}
	q.Enqueue(ctx, "job-waiting", []byte("{}")) // undelivered: lag
	// The 0 ms retry is overdue once Redis's clock has passed its due time.
	eventually.True(t, 10*time.Second, "the 0 ms retry to be overdue", func() bool {
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			return false
		}
		n, _ := rdb.ZCount(ctx, q.Keys().Delayed, "-inf", strconv.FormatInt(now.UnixMilli()-1, 10)).Result()
		return n == 1
	})

	c, err := exporter.NewCollector(rdb, exporter.WithQueues(exporter.QueueFor("orders")))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	emitted := map[string]bool{}
	gatherNames(t, reg, emitted)
	if !emitted["backstop_job_types"] || !hasSeries(t, reg, "backstop_dead_letters_total", "job_type", "charge_card", 1) {
		t.Errorf("the scrape lacks the typed series: backstop_job_types, backstop_dead_letters_total{job_type=\"charge_card\"} 1")
	}

	clientEmitted := scrapeNames(t, "http://"+must(startService(t))+"/metrics")
	idemEmitted := scrapeNames(t, "http://"+startIdempotentService(t, rdb)+"/metrics")

	named := 0
	eachSelector(t, func(e, name string) {
		named++
		switch {
		case strings.Contains(name, ":"):
			// a recording rule's output
		case strings.HasPrefix(name, "backstop_idempotency_"):
			if !idemEmitted[name] {
				t.Errorf("%s names %s, which a service's idempotency middleware does not emit", e, name)
			}
		case strings.HasPrefix(name, "backstop_client_"):
			if !clientEmitted[name] {
				t.Errorf("%s names %s, which a service's retry loop does not emit", e, name)
			}
		case !emitted[name]:
			t.Errorf("%s names %s, which the exporter does not emit", e, name)
		}
	})
	if named < 30 {
		t.Errorf("only %d metric selectors found in the rules and dashboards", named)
	}
}

func must(addr string, _ func()) string { return addr }

// hasSeries reports whether g gathers a counter name with label = value
// and the value v.
func hasSeries(t *testing.T, g prometheus.Gatherer, name, label, value string, v float64) bool {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if f.GetName() == name && l.GetName() == label && l.GetValue() == value && m.GetCounter().GetValue() == v {
					return true
				}
			}
		}
	}
	return false
}

// scrapeNames scrapes url as Prometheus does and returns the names of the
// series it holds (a histogram's _bucket, _sum and _count).
func scrapeNames(t *testing.T, url string) map[string]bool {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	names := map[string]bool{}
	for name, f := range fams {
		if f.GetType().String() != "HISTOGRAM" {
			names[name] = true
			continue
		}
		for _, s := range []string{"_bucket", "_sum", "_count"} {
			names[name+s] = true
		}
	}
	return names
}
