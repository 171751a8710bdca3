package redisqueue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// histogram returns the sample count and sum of histogram name's one
// series in reg (0, 0 when absent).
func histogram(t *testing.T, reg *prometheus.Registry, name string) (uint64, float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && mf.GetType() == dto.MetricType_HISTOGRAM && len(mf.GetMetric()) > 0 {
			h := mf.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	return 0, 0
}

// A retry whose promoter stalled shows in the measured retry latency
// (backstop_client_retry_latency_seconds: failure to the next attempt's
// start), not in the decided delay (backstop_client_retry_delay_seconds).
// The stall is made without waiting: the failed job's member is moved 5 s
// back in the delayed set (as if it failed 5 s ago and no promoter ran
// since), then promoted; the entry carries its due time (due_ms).
func TestRetryLatencyShowsStalledPromoter(t *testing.T) {
	p, err := policy.Parse([]byte(`{"max_attempts": 3, "backoff": {"strategy": "constant", "base": "10ms"}, "jitter": {"mode": "none"}}`))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	q := redisqueue.New(rdb, "latency")
	if _, err := q.Enqueue(ctx, "job-1", nil); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	started := make(chan queue.Job, 2)
	// No promote loop: the promoter is stalled.
	work(t, q, backstop.Native(p), func(_ context.Context, j queue.Job) error {
		started <- j
		if j.Attempt == 1 {
			return &backstop.Failure{HTTPStatus: 503, Err: errors.New("503")}
		}
		return nil
	}, redisqueue.WithBatch(1, 20*time.Millisecond), redisqueue.WithPromote(0, 100), redisqueue.WithReclaim(0, time.Minute, 5),
		redisqueue.WithMetrics(reg, "payments"))
	<-started
	waitFor(t, "the failed job in the delayed set", func() bool { return rdb.ZCard(ctx, "{latency}:delayed").Val() == 1 })
	const stall = 5 * time.Second
	m := rdb.ZRange(ctx, "{latency}:delayed", 0, 0).Val()[0]
	if err := rdb.ZIncrBy(ctx, "{latency}:delayed", -float64(stall.Milliseconds()), m).Err(); err != nil {
		t.Fatal(err)
	}
	if n, _, err := q.Promote(ctx, 10); err != nil || n != 1 {
		t.Fatalf("Promote: %d, %v; want 1 moved", n, err)
	}
	var j queue.Job
	select {
	case j = <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("attempt 2 never started")
	}
	if j.Attempt != 2 || j.DueMs == 0 || j.PrevDelayMs != 10 {
		t.Fatalf("attempt 2: Attempt %d DueMs %d PrevDelayMs %d; want 2, the due time, 10", j.Attempt, j.DueMs, j.PrevDelayMs)
	}
	waitFor(t, "the retry latency recorded", func() bool { n, _ := histogram(t, reg, "backstop_client_retry_latency_seconds"); return n == 1 })
	if n, sum := histogram(t, reg, "backstop_client_retry_delay_seconds"); n != 1 || sum != 0.01 {
		t.Errorf("decided delay: %d samples, sum %v; want 1, 0.01", n, sum)
	}
	if _, sum := histogram(t, reg, "backstop_client_retry_latency_seconds"); sum < stall.Seconds() {
		// The job failed (as the set says) 5 s before its promotion.
		t.Errorf("measured latency %vs; want at least the stall, %v", sum, stall)
	}
}
