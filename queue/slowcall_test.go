package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/queue"
)

// Issue 43: jobs that all succeed, each slower than the policy's
// slow_call_duration_threshold. The Runner measures every run and reports
// it, so the breaker opens on successes alone and the next job is
// deferred without running. The handler takes at least 3 ms against a
// 1 ms threshold: only a lower bound on the clock, never an upper one.
func TestRunnerSlowSuccessesOpenTheBreaker(t *testing.T) {
	p, err := policy.Parse([]byte(`{"circuit_breaker": {"type": "failure_rate", "slow_call_rate_threshold": 100,
		"slow_call_duration_threshold": "1ms", "sliding_window": {"size": 5}, "minimum_calls": 5, "open_for": "1h"}}`))
	if err != nil {
		t.Fatal(err)
	}
	r, err := queue.NewRunner("reports", backstop.Native(p))
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	slow := func(context.Context, queue.Job) error {
		ran++
		for start := time.Now(); time.Since(start) < 3*time.Millisecond; {
		}
		return nil
	}
	ctx := context.Background()
	for i := 0; i < 5; i++ {
		if o := r.Run(ctx, slow, queue.Job{ID: "report", Attempt: 1}); o.Action != queue.Ack {
			t.Fatalf("job %d: %+v, want ack", i, o)
		}
	}
	o := r.Run(ctx, slow, queue.Job{ID: "report", Attempt: 1})
	if o.Action != queue.Defer || o.Reason != policy.CircuitOpen.String() || ran != 5 {
		t.Fatalf("after 5 slow successes: %+v (%d runs), want a deferral by the open breaker before running", o, ran)
	}
}
