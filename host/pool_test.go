package host_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/backstop-dev/backstop/host"
	"github.com/backstop-dev/backstop/policy"
)

const goroutines = 16

func TestConcurrentStateless(t *testing.T) {
	ctx := context.Background()
	rt := runtime(t)
	p, _ := rt.Preset(ctx, "batch")
	native, _ := policy.Preset("batch")
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fs := failures(uint64(100+g), 300)
			for i, f := range fs {
				want, _ := native.Decide(f)
				if got, err := p.Decide(ctx, f); err != nil || got != want {
					t.Errorf("goroutine %d failure %d: %v (%v), want %v", g, i, got, err, want)
					return
				}
			}
			got, err := p.DecideBatch(ctx, fs, nil)
			for i, f := range fs {
				if want, _ := native.Decide(f); err != nil || got[i] != want {
					t.Errorf("goroutine %d batch %d: %v (%v), want %v", g, i, got[i], err, want)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// The breaker counts every failure once, whichever goroutine reports it:
// with a threshold of 50, exactly 49 of the failures are retried and the
// 50th opens the circuit.
func TestConcurrentBreaker(t *testing.T) {
	ctx := context.Background()
	rt := runtime(t)
	p, err := rt.Load(ctx, []byte(`{"max_attempts": 100, "circuit_breaker": {"failure_threshold": 50, "open_for": "1h"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if !p.Stateful() {
		t.Fatal("not stateful")
	}
	// A stateless policy loaded alongside keeps working in parallel.
	other, _ := rt.Preset(ctx, "default")
	var retries, open atomic.Int64
	var wg sync.WaitGroup
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f := policy.Failure{Attempt: 1, HTTPStatus: 503, NowMs: 1_000_000}
			for i := 0; i < 20; i++ {
				var d policy.Decision
				var err error
				if i%4 == 0 {
					var ds []policy.Decision
					ds, err = p.DecideBatch(ctx, []policy.Failure{f}, nil)
					if err == nil {
						d = ds[0]
					}
				} else {
					d, err = p.Decide(ctx, f)
				}
				if err != nil {
					t.Error(err)
					return
				}
				switch d.Reason {
				case policy.Transient:
					retries.Add(1)
				case policy.CircuitOpen:
					open.Add(1)
				default:
					t.Errorf("unexpected %v", d)
				}
				if _, err := other.Decide(ctx, f); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if retries.Load() != 49 || open.Load() != goroutines*20-49 {
		t.Errorf("retries %d, circuit_open %d; want 49 and %d", retries.Load(), open.Load(), goroutines*20-49)
	}
	if s, _ := p.CircuitState(ctx, 1_000_000); s != policy.BreakerOpen {
		t.Errorf("circuit %v", s)
	}
}

// The token bucket grants as many retries under concurrency as in one
// sequence of the same failures.
func TestConcurrentBudget(t *testing.T) {
	ctx := context.Background()
	rt := runtime(t)
	src := []byte(`{"max_attempts": 100, "retry_budget": {"type": "token_bucket", "max_tokens": 40, "token_ratio": 0.5}}`)
	p, _ := rt.Load(ctx, src)
	native, _ := policy.Load(src)
	f := policy.Failure{Attempt: 1, HTTPStatus: 503, NowMs: 5}
	want := 0
	for range goroutines * 10 {
		if d, _ := native.Decide(f); d.Action == policy.Retry {
			want++
		}
	}
	var got atomic.Int64
	var wg sync.WaitGroup
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				if d, err := p.Decide(ctx, f); err == nil && d.Action == policy.Retry {
					got.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if int(got.Load()) != want {
		t.Errorf("%d retries granted, want %d", got.Load(), want)
	}
}

// Loading and closing policies while others decide is safe.
func TestConcurrentLoadClose(t *testing.T) {
	ctx := context.Background()
	rt, err := host.New(ctx, host.SharedCache(), host.WithPoolSize(2))
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				src := "critical"
				if (g+i)%2 == 0 {
					src = statefulPolicy
				}
				p, err := rt.Load(ctx, []byte(src))
				if err != nil {
					t.Error(err)
					return
				}
				if _, err := p.Decide(ctx, policy.Failure{Attempt: 1, HTTPStatus: 503, NowMs: 1767225600000}); err != nil {
					t.Error(err)
				}
				p.Close(ctx)
			}
		}()
	}
	wg.Wait()
}
