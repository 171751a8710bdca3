package bench

import (
	"context"
	"errors"
	"testing"

	"github.com/cenkalti/backoff/v5"
	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/retrypolicy"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/host"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/retry"
)

// attemptsPerCall: each call fails three times, then succeeds. Delays are
// zero in every library, so the figures are the loops' own overhead per
// attempt (classify, decide, account), not sleeping.
const attemptsPerCall = 4

var errTimeout = &backstop.Failure{ErrorKind: "timeout", Err: errors.New("i/o timeout")}

func flaky() func() (int, error) {
	n := 0
	return func() (int, error) {
		if n++; n%attemptsPerCall != 0 {
			return 0, errTimeout
		}
		return n, nil
	}
}

func perAttempt(b *testing.B) {
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*attemptsPerCall), "ns/attempt")
}

// BenchmarkRetryLoop compares backstop's retry.Do with cenkalti/backoff v5's
// Retry and failsafe-go's retry policy, per attempt.
func BenchmarkRetryLoop(b *testing.B) {
	ctx := context.Background()
	const zero = "max_attempts: 10\nbackoff: {strategy: none}\n"
	const withBreaker = zero + "circuit_breaker: {failure_threshold: 1000000, open_for: 10s}\n"
	const withTimeout = zero + "attempt_timeout: 10s\n" // a context.WithTimeout per attempt
	native := func(text string) backstop.Decider {
		p, err := policy.Parse([]byte(text))
		if err != nil {
			b.Fatal(err)
		}
		return backstop.Native(p)
	}
	loop := func(p backstop.Decider, opts ...retry.Option) func(b *testing.B) {
		return func(b *testing.B) {
			f := flaky()
			op := func(context.Context) (int, error) { return f() }
			b.ReportAllocs()
			for b.Loop() {
				if _, err := retry.Do(ctx, p, op, opts...); err != nil {
					b.Fatal(err)
				}
			}
			perAttempt(b)
		}
	}
	b.Run("backstop/native", loop(native(zero)))
	b.Run("backstop/native+breaker", loop(native(withBreaker)))
	b.Run("backstop/native+attempt_timeout", loop(native(withTimeout)))
	b.Run("backstop/native+metrics", loop(native(zero), retry.WithMetrics(prometheus.NewRegistry(), "bench", "dep")))
	rt, err := host.New(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer rt.Close(ctx)
	hp, err := rt.Load(ctx, []byte(zero))
	if err != nil {
		b.Fatal(err)
	}
	b.Run("backstop/wasm", loop(hp))
	hpt, err := rt.Load(ctx, []byte(withTimeout))
	if err != nil {
		b.Fatal(err)
	}
	b.Run("backstop/wasm+attempt_timeout", loop(hpt))

	b.Run("cenkalti-backoff-v5", func(b *testing.B) {
		f := flaky()
		b.ReportAllocs()
		for b.Loop() {
			if _, err := backoff.Retry(ctx, f, backoff.WithBackOff(&backoff.ZeroBackOff{}), backoff.WithMaxTries(10)); err != nil {
				b.Fatal(err)
			}
		}
		perAttempt(b)
	})
	b.Run("failsafe-go", func(b *testing.B) {
		f := flaky()
		rp := retrypolicy.NewBuilder[int]().WithMaxRetries(9).WithDelay(0).Build()
		exec := failsafe.With[int](rp)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := exec.Get(f); err != nil {
				b.Fatal(err)
			}
		}
		perAttempt(b)
	})
}
