package host_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/backstop-dev/backstop/host"
	"github.com/backstop-dev/backstop/policy"
)

// Half-open admits exactly half_open_max_calls trials however many
// goroutines ask at once across the pool: the breaker lives in the one
// instance the policy is pinned to.
func TestConcurrentAcquireAdmitsExactlyMaxCalls(t *testing.T) {
	ctx := context.Background()
	rt := runtime(t) // a pool of 4
	p, err := rt.Load(ctx, []byte(`{"circuit_breaker": {"failure_threshold": 1, "open_for": "1s", "half_open_max_calls": 3}}`))
	if err != nil {
		t.Fatal(err)
	}
	const t0 = 1_700_000_000_000
	if _, err := p.Decide(ctx, policy.Failure{Attempt: 1, HTTPStatus: 503, NowMs: t0}); err != nil {
		t.Fatal(err)
	}
	if pm, err := p.Acquire(ctx, t0+1); err != nil || pm != (policy.Permit{RetryInMs: 999, State: policy.BreakerOpen}) {
		t.Fatalf("open: %+v %v", pm, err)
	}
	var allowed, refused atomic.Int64
	var wg sync.WaitGroup
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				pm, err := p.Acquire(ctx, t0+1000)
				switch {
				case err != nil:
					t.Error(err)
					return
				case pm.State != policy.BreakerHalfOpen:
					t.Errorf("state %v, want half_open", pm.State)
				case pm.Allowed:
					allowed.Add(1)
				default:
					refused.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if allowed.Load() != 3 || refused.Load() != goroutines*10-3 {
		t.Fatalf("allowed %d, refused %d; want 3 and %d", allowed.Load(), refused.Load(), goroutines*10-3)
	}
	// One trial's success closes (half_open_successes 1).
	if err := p.RecordSuccess(ctx, t0+1001); err != nil {
		t.Fatal(err)
	}
	if pm, err := p.Acquire(ctx, t0+1002); err != nil || !pm.Allowed || pm.State != policy.BreakerClosed {
		t.Fatalf("after the trial's success: %+v %v", pm, err)
	}
}

func TestAcquireBadInputAndOnOpen(t *testing.T) {
	ctx := context.Background()
	rt := runtime(t)
	st, err := rt.Load(ctx, []byte(`{"circuit_breaker": {}, "on_open": "dead_letter"}`))
	if err != nil {
		t.Fatal(err)
	}
	sl, _ := rt.Preset(ctx, "default")
	for _, c := range []struct {
		p   *host.Policy
		now int64
	}{{st, 0}, {st, -1}, {sl, -1}} {
		_, err := c.p.Acquire(ctx, c.now)
		var ie *policy.InputError
		if !errors.As(err, &ie) || ie.Field != "now_ms" {
			t.Errorf("Acquire(%d) on stateful=%v: %v, want an InputError naming now_ms", c.now, c.p.Stateful(), err)
		}
	}
	if pm, err := sl.Acquire(ctx, 0); err != nil || !pm.Allowed {
		t.Errorf("stateless Acquire(0): %+v %v", pm, err)
	}
	if st.OnOpen() != policy.OnOpenDeadLetter || sl.OnOpen() != policy.OnOpenDefer {
		t.Errorf("OnOpen: %q %q", st.OnOpen(), sl.OnOpen())
	}
	sl.Close(ctx)
	if _, err := sl.Acquire(ctx, 1); !errors.Is(err, host.ErrClosed) {
		t.Errorf("Acquire after Close: %v", err)
	}
}

// BudgetTokens reads the budget in the module, as the native policy does.
func TestBudgetTokens(t *testing.T) {
	ctx := context.Background()
	rt := runtime(t)
	p, err := rt.Load(ctx, []byte(`{"retry_budget": {"max_tokens": 10, "token_ratio": 0.5}}`))
	if err != nil {
		t.Fatal(err)
	}
	const t0 = 1_700_000_000_000
	if _, err := p.Decide(ctx, policy.Failure{Attempt: 1, HTTPStatus: 503, NowMs: t0}); err != nil {
		t.Fatal(err)
	}
	if m, ok, err := p.BudgetTokens(ctx, t0); err != nil || !ok || m != 9000 {
		t.Fatalf("BudgetTokens = %d, %v, %v; want 9000, true", m, ok, err)
	}
	var ie *host.InputError
	if _, _, err := p.BudgetTokens(ctx, -1); !errors.As(err, &ie) {
		t.Fatalf("now_ms -1: %v, want an InputError", err)
	}
	none, err := rt.Load(ctx, []byte(`{"circuit_breaker": {}}`))
	if err != nil {
		t.Fatal(err)
	}
	if m, ok, err := none.BudgetTokens(ctx, t0); err != nil || ok || m != 0 {
		t.Fatalf("no budget: %d, %v, %v", m, ok, err)
	}
}

// AttemptTimeout asks the module; a closed policy says so.
func TestAttemptTimeout(t *testing.T) {
	ctx := context.Background()
	rt := runtime(t)
	p, err := rt.Load(ctx, []byte(`{"attempt_timeout": "2s", "max_elapsed": "5s"}`))
	if err != nil {
		t.Fatal(err)
	}
	if ms, err := p.AttemptTimeout(ctx, 4000); err != nil || ms != 1000 {
		t.Fatalf("AttemptTimeout(4000) = %d, %v; want 1000", ms, err)
	}
	var ie *host.InputError
	if _, err := p.AttemptTimeout(ctx, -1); !errors.As(err, &ie) || !strings.Contains(err.Error(), "elapsed_ms: must be >= 0 (got -1)") {
		t.Fatalf("elapsed -1: %v, want an InputError", err)
	}
	p.Close(ctx)
	if _, err := p.AttemptTimeout(ctx, 0); !errors.Is(err, host.ErrClosed) {
		t.Fatalf("after Close: %v, want ErrClosed", err)
	}
}

// RecordDuration through the module: a negative duration, or no now_ms on
// a policy with a slow-call rate, is an InputError naming the field and
// changes nothing; a slow call counts; a stateless policy needs no call.
func TestRecordDuration(t *testing.T) {
	ctx := context.Background()
	rt := runtime(t)
	st, err := rt.Load(ctx, []byte(`{"circuit_breaker": {"type": "failure_rate", "slow_call_rate_threshold": 100,
		"slow_call_duration_threshold": "1s", "sliding_window": {"size": 2}, "minimum_calls": 2}}`))
	if err != nil {
		t.Fatal(err)
	}
	sl, _ := rt.Preset(ctx, "default")
	const t0 = 1_700_000_000_000
	for _, c := range []struct {
		p        *host.Policy
		now, dur int64
		field    string
	}{{st, t0, -1, "duration_ms"}, {st, 0, 5000, "now_ms"}, {sl, t0, -1, "duration_ms"}} {
		err := c.p.RecordDuration(ctx, c.now, c.dur)
		var ie *policy.InputError
		if !errors.As(err, &ie) || ie.Field != c.field {
			t.Errorf("RecordDuration(%d, %d) on stateful=%v: %v, want an InputError naming %s", c.now, c.dur, c.p.Stateful(), err, c.field)
		}
	}
	for i := int64(1); i <= 2; i++ {
		if err := st.RecordDuration(ctx, t0+i, 1001); err != nil {
			t.Fatal(err)
		}
		want := policy.BreakerOpen
		if i == 1 {
			want = policy.BreakerClosed // the invalid reports counted nothing: under minimum_calls
		}
		if s, _ := st.CircuitState(ctx, t0+i); s != want {
			t.Errorf("after %d slow calls: %v, want %v", i, s, want)
		}
	}
	if err := sl.RecordDuration(ctx, 0, 5); err != nil {
		t.Errorf("stateless RecordDuration: %v", err)
	}
	sl.Close(ctx)
	if err := sl.RecordDuration(ctx, 1, 1); !errors.Is(err, host.ErrClosed) {
		t.Errorf("RecordDuration after Close: %v", err)
	}
}
