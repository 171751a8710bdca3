package bench

import (
	"context"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/backstop-dev/backstop/host"
	"github.com/backstop-dev/backstop/policy"
)

// transient is the work NextBackOff does: a retryable failure, the next
// jittered exponential delay.
var transient = func() []policy.Failure {
	fs := make([]policy.Failure, 1024)
	for i := range fs {
		fs[i] = policy.Failure{Attempt: int64(1 + i%4), HTTPStatus: 503, Random: float64(i%97) / 97}
	}
	return fs
}()

// mixed is what a worker sees: a mix of classes, attempt numbers, a
// Retry-After header, error kinds and methods.
var mixed = func() []policy.Failure {
	fs := make([]policy.Failure, 1024)
	for i := range fs {
		f := policy.Failure{Attempt: int64(1 + i%5), Random: float64(i%97) / 97, ElapsedMs: int64(i * 37), NowMs: 1767225600000}
		switch i % 8 {
		case 0, 1, 2:
			f.HTTPStatus = 503
		case 3:
			f.HTTPStatus = 429
			f.RetryAfter = "3"
		case 4:
			f.GRPCCode = 14
		case 5:
			f.ErrorKind = "timeout"
		case 6:
			f.HTTPStatus = 400
		case 7:
			f.HTTPStatus = 502
			f.Method = "GET"
		}
		fs[i] = f
	}
	return fs
}()

// BenchmarkDecide compares one decision: backstop's native core, the same
// core through wazero (scalar and batch ABI), and cenkalti/backoff/v5's
// NextBackOff, which only computes a jittered exponential delay (no
// classification, limits, Retry-After or idempotency gate). Each backstop
// contender runs two workloads: transient (the work NextBackOff does) and
// mixed.
func BenchmarkDecide(b *testing.B) {
	b.Run("cenkalti-backoff-v5-NextBackOff", func(b *testing.B) {
		eb := backoff.NewExponentialBackOff()
		eb.InitialInterval = time.Second
		eb.MaxInterval = 300 * time.Second
		eb.RandomizationFactor = 0.5
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if i%4 == 0 {
				eb.Reset()
			}
			_ = eb.NextBackOff()
		}
	})
	native, err := policy.Preset("default")
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	rt, err := host.New(ctx, host.WithPoolSize(1))
	if err != nil {
		b.Fatal(err)
	}
	defer rt.Close(ctx)
	p, err := rt.Preset(ctx, "default")
	if err != nil {
		b.Fatal(err)
	}
	for _, w := range []struct {
		name     string
		failures []policy.Failure
	}{{"transient", transient}, {"mixed", mixed}} {
		fs := w.failures
		b.Run("backstop-native/"+w.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if _, err := native.Decide(fs[i&1023]); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("backstop-wazero-scalar/"+w.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if _, err := p.Decide(ctx, fs[i&1023]); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("backstop-wazero-batch/"+w.name, func(b *testing.B) {
			out := make([]policy.Decision, 0, len(fs))
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				if out, err = p.DecideBatch(ctx, fs, out[:0]); err != nil {
					b.Fatal(err)
				}
				n += len(fs)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/decision")
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "decisions/s")
		})
	}
}
