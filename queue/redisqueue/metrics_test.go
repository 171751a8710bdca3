package redisqueue_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// A worker with WithMetrics exports the backstop_client_* families Go's
// retry loop does, with target = the queue's name: a success, a failure
// that opens the breaker (deferred: a retry with reason circuit_open), and
// jobs the open breaker refuses before they run.
func TestWorkerMetrics(t *testing.T) {
	const src = `{"max_attempts": 3, "backoff": {"base": "10ms", "cap": "20ms"}, "jitter": {"mode": "none"},
	 "circuit_breaker": {"failure_threshold": 1, "open_for": "1h"}}`
	p, err := policy.Parse([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	q := redisqueue.New(rdb, "orders")
	for _, id := range []string{"job-ok", "job-fails", "job-refused"} {
		if _, err := q.Enqueue(ctx, id, nil); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	work(t, q, backstop.Native(p), func(ctx context.Context, j queue.Job) error {
		if j.ID == "job-ok" {
			return nil
		}
		return &backstop.Failure{HTTPStatus: 503, Err: errors.New("503")}
	}, // One read takes all three: the worker stops reading once the breaker opens.
		redisqueue.WithBatch(3, 20*time.Millisecond), redisqueue.WithPromote(0, 100), redisqueue.WithReclaim(0, time.Minute, 5),
		redisqueue.WithConsumer("w1"), redisqueue.WithMetrics(reg, "payments"))

	refused := func() float64 {
		n, _ := testutil.GatherAndCount(reg, "backstop_client_calls_refused_total")
		if n == 0 {
			return 0
		}
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() == "backstop_client_calls_refused_total" {
				return mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
		return 0
	}
	waitFor(t, "a job refused by the open breaker", func() bool { return refused() >= 1 })
	const want = `
# HELP backstop_client_attempts_total Calls made (or refused) under a backstop policy, by outcome: success, retry, dead_letter, refused.
# TYPE backstop_client_attempts_total counter
backstop_client_attempts_total{outcome="dead_letter",policy="payments",target="orders"} 0
backstop_client_attempts_total{outcome="refused",policy="payments",target="orders"} 1
backstop_client_attempts_total{outcome="retry",policy="payments",target="orders"} 1
backstop_client_attempts_total{outcome="success",policy="payments",target="orders"} 1
# HELP backstop_client_circuit_state Circuit breaker state last seen by this process: 1 for the current state, 0 for the others.
# TYPE backstop_client_circuit_state gauge
backstop_client_circuit_state{policy="payments",state="closed",target="orders"} 0
backstop_client_circuit_state{policy="payments",state="half_open",target="orders"} 0
backstop_client_circuit_state{policy="payments",state="open",target="orders"} 1
# HELP backstop_client_circuit_transitions_total Circuit breaker state changes seen by this process.
# TYPE backstop_client_circuit_transitions_total counter
backstop_client_circuit_transitions_total{from="closed",policy="payments",target="orders",to="open"} 1
# HELP backstop_client_retries_total Retries scheduled, by the policy's reason.
# TYPE backstop_client_retries_total counter
backstop_client_retries_total{policy="payments",reason="circuit_open",target="orders"} 1
`
	// The refused job is deferred; the worker reads nothing more while the
	// breaker is open, so the counts hold.
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "backstop_client_attempts_total",
		"backstop_client_circuit_state", "backstop_client_circuit_transitions_total", "backstop_client_retries_total"); err != nil {
		t.Fatal(err)
	}
}

// The worker exports the retry budget left after each job.
func TestWorkerMetricsBudget(t *testing.T) {
	p, err := policy.Parse([]byte(`{"retry_budget": {"max_tokens": 10, "token_ratio": 0.5}}`))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	q := redisqueue.New(rdb, "orders")
	for _, id := range []string{"job-1", "job-2"} {
		if _, err := q.Enqueue(ctx, id, nil); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	work(t, q, backstop.Native(p), func(ctx context.Context, j queue.Job) error {
		return &backstop.Failure{HTTPStatus: 503, Err: errors.New("503")}
	}, redisqueue.WithBatch(2, 20*time.Millisecond), redisqueue.WithPromote(0, 100), redisqueue.WithReclaim(0, time.Minute, 5),
		redisqueue.WithConsumer("w1"), redisqueue.WithMetrics(reg, "payments"))
	waitFor(t, "both jobs retried", func() bool { return counters(t, ctx, q)["attempts:retry"] == 2 })
	const want = `
# HELP backstop_client_budget_tokens Retry budget left as last seen by this process: a token bucket's tokens (retries pass while more than half remain), or the retries a window budget still allows. Absent without a budget.
# TYPE backstop_client_budget_tokens gauge
backstop_client_budget_tokens{policy="payments",target="orders"} 8
`
	// The gauge is set after the outcome is applied: wait for it too.
	waitFor(t, "the gauge", func() bool {
		return testutil.GatherAndCompare(reg, strings.NewReader(want), "backstop_client_budget_tokens") == nil
	})
}

func TestWorkerMetricsBadInput(t *testing.T) {
	q := redisqueue.New(redistest.Start(t).Client(), "orders")
	p, _ := policy.Preset("default")
	err := q.Work(context.Background(), backstop.Native(p), func(context.Context, queue.Job) error { return nil },
		redisqueue.WithMetrics(prometheus.NewRegistry(), "pay\xffments"))
	if err == nil || !strings.Contains(err.Error(), `queue: WithMetrics: policy "pay\xffments": not valid UTF-8`) {
		t.Fatalf("Work = %v, want the invalid label named before any work", err)
	}
}
