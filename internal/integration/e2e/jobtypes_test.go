package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/dashboards"
	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// TestFailingJobTypeIsNamed runs three job types and untyped jobs on one
// queue, where only charge_card fails (half its jobs retried, half
// dead-lettered), through the real path: redis-server, backstop-exporter,
// Prometheus with the generated rules, Alertmanager with the shipped
// configuration. The tickets name charge_card and no other type; the
// recording rule and the dashboard's "Dead letters by job type" query show
// charge_card alone.
func TestFailingJobTypeIsNamed(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: runs in make test, not with -short")
	}
	ctx := context.Background()
	rdb, q, hooks, promAddr := startRulesPath(t)

	stop := runTypedJobs(t, ctx, rdb, q)
	defer stop()
	// Dead letters of any type are BackstopDeadLetter's, one per queue
	// (issue 42: BackstopJobTypeDeadLetters is folded into it).
	for _, name := range []string{"BackstopJobTypeHighRetryRate"} {
		a := hooks.wait(t, 120*time.Second, "/ticket", "firing", name)
		if a.Labels["job_type"] != "charge_card" || a.Labels["queue"] != "orders" || !strings.Contains(a.Annotations["summary"], "charge_card jobs on queue orders") {
			t.Errorf("%s: %+v", name, a)
		}
	}

	// The recording rule: charge_card retries half its attempts, the
	// others none.
	var ratios map[string]float64
	eventually.True(t, 60*time.Second, "the retry ratio of every type", func() bool {
		ratios = promQuery(t, promAddr, `queue_job_type:backstop_retry_rate:ratio_rate5m{queue="orders"}`)
		return len(ratios) == 4
	})
	for jt, v := range ratios {
		if (jt == "charge_card") != (v > 0.2) {
			t.Errorf("queue_job_type:backstop_retry_rate:ratio_rate5m{job_type=%q} = %v", jt, v)
		}
	}
	// The dashboard's query, with its variables as Grafana fills them
	// (All types: ".*").
	var expr string
	for _, p := range dashboards.Queue().Panels {
		if p.Title == "Dead letters by job type" {
			expr = p.Targets[0].Expr
		}
	}
	expr = strings.NewReplacer(`"$job"`, `".+"`, `"$instance"`, `".+"`, `"$queue"`, `"orders"`, `"$job_type"`, `".*"`, "$__rate_interval", "1m").Replace(expr)
	var dead map[string]float64
	eventually.True(t, 60*time.Second, "dead letters by type on the dashboard", func() bool {
		dead = promQuery(t, promAddr, expr)
		return dead["charge_card"] > 0
	})
	for jt, v := range dead {
		if jt != "charge_card" && v != 0 {
			t.Errorf("dashboard: job_type %q dead-letters %v/s, want only charge_card", jt, v)
		}
	}

	stop()
	hooks.mu.Lock()
	defer hooks.mu.Unlock()
	for _, n := range hooks.got {
		if strings.HasPrefix(n.alert.Labels["alertname"], "BackstopJobType") && n.alert.Labels["job_type"] != "charge_card" {
			t.Errorf("a healthy type alerted: %+v", n.alert)
		}
	}
}

// runTypedJobs enqueues and settles a job of each type every 100 ms until
// the returned stop is called (stop waits, and may be called twice).
func runTypedJobs(t *testing.T, ctx context.Context, rdb *redis.Client, q *redisqueue.Queue) (stop func()) {
	return every100ms(func(i int) bool {
		for _, typ := range []string{"send_email", "render_report", "charge_card", ""} {
			if _, err := q.Enqueue(ctx, fmt.Sprintf("%s-%d", typ, i), []byte("{}"), redisqueue.WithJobType(typ)); err != nil {
				t.Error(err)
				return false
			}
		}
		res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: q.Group(), Consumer: "e2e", Streams: []string{q.Keys().Jobs, ">"}, Count: 4}).Result()
		if err != nil || len(res) == 0 {
			t.Errorf("read: %v", err)
			return false
		}
		for _, m := range res[0].Messages {
			switch {
			case m.Values["type"] != "charge_card":
				_, err = q.Ack(ctx, m.ID)
			case i%2 == 0:
				_, _, err = q.Retry(ctx, m.ID, time.Hour, "transient", "HTTP 503")
			default:
				_, err = q.DeadLetter(ctx, m.ID, "max_attempts_reached", "HTTP 503")
			}
			if err != nil {
				t.Error(err)
				return false
			}
		}
		return true
	})
}

// promQuery runs an instant query on Prometheus and returns its samples
// by job_type ("" when the series has none).
func promQuery(t *testing.T, addr, query string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/api/v1/query?query=" + url.QueryEscape(query))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || body.Status != "success" {
		t.Fatalf("query %s: %v %s", query, err, body.Error)
	}
	out := map[string]float64{}
	for _, r := range body.Data.Result {
		s, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			t.Fatalf("query %s: value %v", query, r.Value[1])
		}
		out[r.Metric["job_type"]] = v
	}
	return out
}
