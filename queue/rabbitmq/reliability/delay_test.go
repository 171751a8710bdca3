package reliability

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/rabbitmq"
)

// delayPolicy takes Retry-After as the delay, up to 2 h.
const delayPolicy = `{"max_attempts": 3, "backoff": {"strategy": "constant", "base": "1s"}, "jitter": {"mode": "none"},
 "retry_after": {"cap": "2h", "on_exceed": "clamp"}}`

// TestDelaysOnTimeBehindALongerOne: a job retried in 1 h is delayed first;
// then jobs retried in 10 s, 3 s and 1 s. Each short one comes back no
// earlier than its delay after its failure and at most max(1 s, 5 %)
// later, while the hour-long one still waits in its level: no delay is
// held behind a longer one. (The delays up to 24 h are proved by the
// routing, queue/rabbitmq's TestDelayRoutingAcrossTheRange.)
func TestDelaysOnTimeBehindALongerOne(t *testing.T) {
	broker := shared.Broker(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b, err := rabbitmq.Open(ctx, broker.URL(), rabbitmq.WithLogger(quietLog))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	p, err := policy.Parse([]byte(delayPolicy))
	if err != nil {
		t.Fatal(err)
	}
	q := b.Queue("ontime")
	delays := map[string]time.Duration{"hour": time.Hour, "s10": 10 * time.Second, "s3": 3 * time.Second, "s1": time.Second}
	var mu sync.Mutex
	failed, arrived := map[string]time.Time{}, map[string]time.Time{}
	handler := func(_ context.Context, j queue.Job) error {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		if j.Attempt == 1 {
			failed[j.ID] = now
			return &backstop.Failure{HTTPStatus: 503, RetryAfter: strconv.Itoa(int(delays[j.ID] / time.Second)), Err: errors.New("503")}
		}
		arrived[j.ID] = now
		return nil
	}
	done := make(chan error, 1)
	go func() {
		done <- q.Work(ctx, backstop.Native(p), handler, rabbitmq.WithPrefetch(4), rabbitmq.WithConcurrency(4))
	}()
	// The hour hops the levels for their 2047 s (every bit up to 10) and
	// is delayed again on arrival: first it is held in hold.L10.
	held := func() int { return messages(t, broker, "backstop.hold.L10") }
	if err := q.Enqueue(ctx, "hour", nil); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, 30*time.Second, "the hour-long retry in hold.L10", func() bool { return held() == 1 })
	for _, id := range []string{"s10", "s3", "s1"} {
		if err := q.Enqueue(ctx, id, nil); err != nil {
			t.Fatal(err)
		}
	}
	eventually.True(t, 60*time.Second, "the 10 s, 3 s and 1 s retries to come back", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(arrived) == 3
	})
	mu.Lock()
	defer mu.Unlock()
	for _, id := range []string{"s1", "s3", "s10"} {
		d := delays[id]
		took := arrived[id].Sub(failed[id])
		// The due time is set after the failure, so took-d bounds the
		// lateness from above.
		if took < d || took-d > max(time.Second, d/20) {
			t.Errorf("%s: retried %v after its failure, want %v to %v", id, took, d, d+max(time.Second, d/20))
		}
		t.Logf("%s: back %v after its failure (%v late at most)", id, took.Round(time.Millisecond), (took - d).Round(time.Millisecond))
	}
	if _, back := arrived["hour"]; back || held() != 1 {
		t.Errorf("the hour-long retry: back %v, hold.L10 holds %d, want it waiting there", back, held())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
