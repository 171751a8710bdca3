package rabbitmq

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/queue"
)

// latency returns the sample count and sum of
// backstop_client_retry_latency_seconds in reg.
func latency(t *testing.T, reg *prometheus.Registry) (uint64, float64) {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == "backstop_client_retry_latency_seconds" && len(f.GetMetric()) == 1 {
			h := f.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	return 0, 0
}

// The measured retry latency (failure to the next attempt's start) shows
// what the decided delay does not: a retry through the delay levels takes
// at least its decided delay, and a job whose mover stalled arrives late by
// the stall. A job deferred since
// its last failure (last reason circuit_open) is not measured.
func TestRetryLatencyShowsStalledMover(t *testing.T) {
	rb := shared.Broker(t)
	b := openBroker(t, rb.URL())
	ctx := context.Background()
	q := b.Queue("latency")
	if err := q.Declare(ctx); err != nil {
		t.Fatal(err)
	}
	if err := q.Enqueue(ctx, "real", nil); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	done := make(chan queue.Job, 4)
	work(t, q, native(t, `{"max_attempts": 3, "backoff": {"strategy": "constant", "base": "10ms"}, "jitter": {"mode": "none"}}`),
		func(_ context.Context, j queue.Job) error {
			if j.ID == "real" && j.Attempt == 1 {
				return &backstop.Failure{HTTPStatus: 503, Err: errors.New("503")}
			}
			done <- j
			return nil
		}, WithMetrics(reg, "payments"))
	take := func(what string) queue.Job {
		select {
		case j := <-done:
			return j
		case <-time.After(wait):
			t.Fatalf("%s never ran", what)
			return queue.Job{}
		}
	}
	if j := take("the retried job"); j.Attempt != 2 || j.PrevDelayMs != 10 || j.DueMs == 0 {
		t.Fatalf("retried job: Attempt %d PrevDelayMs %d DueMs %d; want 2, 10, its due time", j.Attempt, j.PrevDelayMs, j.DueMs)
	}
	eventually.True(t, wait, "the retry latency recorded", func() bool { n, _ := latency(t, reg); return n == 1 })
	if _, sum := latency(t, reg); sum < 0.01 {
		t.Errorf("latency through the delay levels: %vs; want at least the decided 10 ms", sum)
	}
	_, before := latency(t, reg)

	// What a stalled mover delivers: attempt 2 of a job that failed 5 s ago
	// with a 10 ms delay; then a deferred one, not measured.
	const stall = 5 * time.Second
	ch := rb.Channel(t)
	due := time.Now().Add(-stall).UnixMilli()
	for _, m := range []struct{ id, reason string }{{"deferred", "circuit_open"}, {"stalled", "transient"}} {
		if err := ch.PublishWithContext(ctx, "", "latency", false, false, amqp.Publishing{MessageId: m.id, Headers: amqp.Table{
			HeaderAttempt: "2", HeaderFirstEnqueuedMs: itoa(due - 10), HeaderDueMs: itoa(due), HeaderPrevDelayMs: "10",
			HeaderLastReason: m.reason, HeaderDestination: "latency"}}); err != nil {
			t.Fatal(err)
		}
		take(m.id)
	}
	eventually.True(t, wait, "the stalled retry's latency recorded", func() bool { n, _ := latency(t, reg); return n == 2 })
	if _, sum := latency(t, reg); sum-before < stall.Seconds() {
		t.Errorf("latency after a %v stall: %vs; want at least the stall", stall, sum-before)
	}
	if n, _ := latency(t, reg); n != 2 {
		t.Errorf("%d latencies recorded; want 2 (the deferred job is not a retry)", n)
	}
}
