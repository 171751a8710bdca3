package host_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/backstop-dev/backstop/host"
	"github.com/backstop-dev/backstop/policy"
)

// Outcome's errors have Decide's shapes: an invalid failure comes with the
// Outcome that dead-letters it, from the host's checks and the module's
// alike; an invalid event is an *InputError alone; a closed policy is
// ErrClosed.
func TestOutcomeErrors(t *testing.T) {
	ctx := context.Background()
	rt := runtime(t)
	invalid := policy.Outcome{Action: policy.OutcomeDeadLetter, Reason: policy.Malformed, Count: policy.CountDeadLetter, Invalid: true}
	for _, src := range []string{statefulPolicy, `{}`} {
		p, err := rt.Load(ctx, []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		const now = 1_700_000_000_000
		for _, c := range []struct {
			e       policy.JobEvent
			outcome policy.Outcome
			msg     string
		}{
			{policy.JobEvent{Event: policy.EventFailure, Failure: policy.Failure{Attempt: 0, NowMs: now}}, invalid, "invalid failure: attempt: must be >= 1 (got 0)"},
			{policy.JobEvent{Event: policy.EventFailure, Failure: policy.Failure{Attempt: 1, HTTPStatus: 1 << 40, NowMs: now}}, invalid, "invalid failure: http_status: must be a 32-bit integer"},
			{policy.JobEvent{Event: policy.EventFailure, Failure: policy.Failure{Attempt: 1, Method: strings.Repeat("x", 70000), NowMs: now}}, invalid, "invalid failure: method: must be at most 65535 bytes"},
			{policy.JobEvent{Event: 7}, policy.Outcome{}, "invalid event: event: must be 0 (before) to 3 (delivered) (got 7)"},
			{policy.JobEvent{Event: policy.EventDelivered, Deliveries: 1, MaxDeliveries: -2}, policy.Outcome{}, "invalid event: max_deliveries: must be >= 0 (got -2)"},
			{policy.JobEvent{Event: policy.EventBefore, Failure: policy.Failure{NowMs: -1}}, policy.Outcome{}, "invalid event: now_ms: must be >= 0 (got -1)"},
		} {
			o, err := p.Outcome(ctx, c.e)
			var ie *host.InputError
			if o != c.outcome || !errors.As(err, &ie) || !strings.HasPrefix(ie.Message, c.msg) {
				t.Errorf("%.20s: Outcome(%v) = %+v, %v; want %+v, %q", src, c.e.Event, o, err, c.outcome, c.msg)
			}
		}
		if o, err := p.Outcome(ctx, policy.JobEvent{Event: policy.EventDelivered, Deliveries: 5, MaxDeliveries: 5}); err != nil ||
			o != (policy.Outcome{Action: policy.OutcomeDeadLetter, Reason: policy.CrashLoop}) {
			t.Errorf("crash loop: %+v, %v", o, err)
		}
		p.Close(ctx)
		for _, ev := range []policy.Event{policy.EventBefore, policy.EventSuccess, policy.EventFailure, policy.EventDelivered} {
			if _, err := p.Outcome(ctx, policy.JobEvent{Event: ev, Failure: policy.Failure{Attempt: 1, NowMs: now}}); !errors.Is(err, host.ErrClosed) {
				t.Errorf("%.20s: %v after Close: %v, want ErrClosed", src, ev, err)
			}
		}
	}
}

// A failure whose strings grow the module's buffer (a call of its own
// before outcome's) is asked as any other: on a fresh instance, whose
// buffer is the smallest, the native core and the module agree.
func TestOutcomeGrowsTheBuffer(t *testing.T) {
	ctx := context.Background()
	rt, err := host.New(ctx, host.SharedCache(), host.WithPoolSize(1))
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	p, err := rt.Load(ctx, []byte(statefulPolicy))
	if err != nil {
		t.Fatal(err)
	}
	native, err := policy.Parse([]byte(statefulPolicy))
	if err != nil {
		t.Fatal(err)
	}
	e := policy.JobEvent{Event: policy.EventFailure, Failure: policy.Failure{Attempt: 1, HTTPStatus: 503,
		ErrorKind: strings.Repeat("k", 60_000), NowMs: 1_700_000_000_000, Random: 0.5}}
	got, err := p.Outcome(ctx, e)
	want, _ := native.Outcome(e)
	if err != nil || got != want {
		t.Fatalf("Outcome = %+v, %v; native %+v", got, err, want)
	}
}
