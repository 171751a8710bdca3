package host_test

import (
	"context"
	"os"
	"testing"

	"github.com/backstop-dev/backstop/host"
	"github.com/backstop-dev/backstop/internal/abi"
	"github.com/backstop-dev/backstop/internal/failvalue"
	"github.com/backstop-dev/backstop/policy"
)

// BenchmarkDecideValue compares the slow path an SDK takes for a value its
// fast path does not convert (decide_value, outcome_value: the failure as
// a value, converted in the module) with the typed exports, on the same
// failure (issue 41). "invalid" is a field of the wrong type, whose answer
// is -3 and a message the host reads back. BACKSTOP_BENCH_MODULE names
// another build of backstop.wasm to measure instead of the embedded one.
func BenchmarkDecideValue(b *testing.B) {
	ctx := context.Background()
	rt := runtime(b)
	if path := os.Getenv("BACKSTOP_BENCH_MODULE"); path != "" {
		// Another build of the module, to pair a change with its base.
		wasm, err := os.ReadFile(path)
		if err != nil {
			b.Fatal(err)
		}
		if rt, err = host.New(ctx, host.WithModule(wasm), host.WithPoolSize(1)); err != nil {
			b.Fatal(err)
		}
		defer rt.Close(ctx)
	}
	p, err := rt.Preset(ctx, "default")
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close(ctx)
	const now = 1_700_000_000_000
	typed := policy.Failure{Attempt: 3, HTTPStatus: 503, NowMs: now, Random: 0.5}
	value := func(status any) []byte {
		enc, err := failvalue.Append(nil, map[string]any{
			"attempt": 3, "http_status": status, "now_ms": int64(now), "random": 0.5})
		if err != nil {
			b.Fatal(err)
		}
		return enc
	}
	valid, invalid := value(503), value("503")
	call := func(b *testing.B, event int32, enc []byte, want func(int64) bool) {
		b.ReportAllocs()
		for b.Loop() {
			w, msg, err := host.CallValue(ctx, p, event, enc, int32(len(enc)), 1, 5)
			if err != nil || !want(w) {
				b.Fatalf("= %d, %q, %v", w, msg, err)
			}
		}
		b.ReportMetric(float64(host.MemorySize(rt))/(1<<20), "MiB")
	}
	ok := func(w int64) bool { return w >= 0 }
	b.Run("decide", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := p.Decide(ctx, typed); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decide_value/valid", func(b *testing.B) { call(b, -1, valid, ok) })
	b.Run("decide_value/invalid", func(b *testing.B) {
		call(b, -1, invalid, func(w int64) bool { return w == abi.ErrInput })
	})
	b.Run("outcome", func(b *testing.B) {
		e := policy.JobEvent{Event: policy.EventFailure, Failure: typed, Deliveries: 1, MaxDeliveries: 5}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := p.Outcome(ctx, e); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("outcome_value/valid", func(b *testing.B) {
		call(b, int32(policy.EventFailure), valid, func(w int64) bool { return w >= 0 && !abi.UnpackOutcome(w).Invalid })
	})
	b.Run("outcome_value/invalid", func(b *testing.B) {
		call(b, int32(policy.EventFailure), invalid, func(w int64) bool { return w >= 0 && abi.UnpackOutcome(w).Invalid })
	})
}
