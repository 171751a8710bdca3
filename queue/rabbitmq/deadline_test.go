package rabbitmq

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/backstop-dev/backstop/internal/ctxtime"
	"github.com/backstop-dev/backstop/internal/testing/casetest"
	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/internal/testing/logbuf"
	"github.com/backstop-dev/backstop/queue"
)

// withHeartbeat asks the broker for an AMQP heartbeat of d (the client's
// default is 10s; the broker's is 60s, and the smaller wins).
func withHeartbeat(d time.Duration) Option { return func(c *brokerConfig) { c.amqp.Heartbeat = d } }

// A handler that runs past the connection's heartbeat timeout (1s
// negotiated) runs once and is acked: the heartbeats go on while it runs,
// so the broker keeps the connection and does not deliver the job again.
func TestHandlerPastTheHeartbeatRunsOnce(t *testing.T) {
	rb := shared.Broker(t)
	logs := &logbuf.Buffer{}
	b := openBroker(t, rb.URL(), withHeartbeat(time.Second), WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	b.mu.Lock()
	hb, gen := b.conn.Config.Heartbeat, b.gen
	b.mu.Unlock()
	if hb != time.Second {
		t.Fatalf("negotiated heartbeat %v, want 1s", hb)
	}
	ctx := context.Background()
	q := b.Queue("past-heartbeat")
	if err := q.Enqueue(ctx, "job-1", nil); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	var calls atomic.Int64
	work(t, q, native(t, `{"max_attempts": 3}`), func(ctx context.Context, j queue.Job) error {
		calls.Add(1)
		ctxtime.Sleep(ctx, 4*hb) // the work: twice the broker's heartbeat timeout
		return nil
	}, WithMetrics(reg, "default"))
	eventually.True(t, wait, "the job acked", func() bool {
		return metric(t, reg, "backstop_attempts_total", map[string]string{"queue": "past-heartbeat", "job_type": "", "outcome": "success"}) == 1
	})
	ch := rb.Channel(t)
	st, err := ch.QueueDeclarePassive("past-heartbeat", true, false, false, false, nil)
	if err != nil || st.Messages != 0 {
		t.Errorf("work queue %+v (%v), want empty", st, err)
	}
	b.mu.Lock()
	regen := b.gen
	b.mu.Unlock()
	if calls.Load() != 1 || regen != gen || strings.Contains(logs.String(), "consumer lost") {
		t.Errorf("ran %d times, connection generation %d then %d, logs:\n%s\nwant one run on one connection", calls.Load(), gen, regen, logs)
	}
}

// A handler past the handler timeout fails that attempt as a timeout: the
// job goes to the delay levels once, attempt counted, and the worker does
// not wait for a handler that ignores its ctx.
func TestHandlerPastItsDeadlineIsRetried(t *testing.T) {
	rb := shared.Broker(t)
	logs := &logbuf.Buffer{}
	b := openBroker(t, rb.URL(), WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	ctx := context.Background()
	q := b.Queue("past-deadline")
	if err := q.Enqueue(ctx, "job-1", nil); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	spy := &casetest.KindSpy{Decider: native(t, `{"max_attempts": 3, "backoff": {"base": "1s", "cap": "1s"}, "jitter": {"mode": "none"}}`)}
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	var calls atomic.Int64
	work(t, q, spy, func(ctx context.Context, j queue.Job) error {
		if calls.Add(1) > 1 {
			return nil // the retry, a second later, succeeds: nothing is left in the shared delay levels
		}
		if _, ok := ctx.Deadline(); !ok {
			t.Error("the handler's ctx has no deadline")
		}
		<-release // ignores ctx
		return nil
	}, WithHandlerTimeout(300*time.Millisecond), WithMetrics(reg, "default"))
	labels := map[string]string{"queue": "past-deadline", "job_type": "", "reason": "transient"}
	eventually.True(t, wait, "the job retried", func() bool { return metric(t, reg, "backstop_retries_total", labels) == 1 })
	kinds := spy.Kinds()
	ch := rb.Channel(t)
	st, err := ch.QueueDeclarePassive("past-deadline", true, false, false, false, nil)
	if err != nil || st.Messages != 0 {
		t.Errorf("work queue %+v (%v), want empty", st, err)
	}
	if len(kinds) != 1 || kinds[0] != "timeout" {
		t.Errorf("decided %q: want one timeout", kinds)
	}
	eventually.True(t, wait, "the retry acked", func() bool {
		return metric(t, reg, "backstop_attempts_total", map[string]string{"queue": "past-deadline", "job_type": "", "outcome": "success"}) == 1
	})
	if calls.Load() != 2 {
		t.Errorf("ran %d times, want twice: the timed-out attempt and its retry", calls.Load())
	}
	if got := metric(t, reg, "backstop_attempts_total", map[string]string{"queue": "past-deadline", "job_type": "", "outcome": "retry"}); got != 1 {
		t.Errorf("attempts retried = %v, want 1", got)
	}
	if n := strings.Count(logs.String(), "not waited for"); n != 1 {
		t.Errorf("logged the abandoned handler %d times, want once:\n%s", n, logs)
	}
}

func TestHandlerTimeoutMustBePositive(t *testing.T) {
	b := openBroker(t, shared.Broker(t).URL())
	q := b.Queue("bad-timeout")
	for _, d := range []time.Duration{0, -time.Second} {
		err := q.Work(context.Background(), native(t, `{}`), func(context.Context, queue.Job) error { return nil }, WithHandlerTimeout(d))
		if err == nil || !strings.Contains(err.Error(), "WithHandlerTimeout") {
			t.Errorf("WithHandlerTimeout(%v): Work returned %v, want an error naming the option", d, err)
		}
	}
}
