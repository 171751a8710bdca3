package bench

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/backstop-dev/backstop/host"
	"github.com/backstop-dev/backstop/policy"
)

// cpuNow is the process's CPU time (user + system). On a shared machine a
// benchmark's wall time counts the time other processes held the core;
// its CPU time mostly does not, so issue 41's before/after pairs compare
// this ("cpu-ns/op") as well as ns/op.
func cpuNow() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuMetric runs the loop of a benchmark and reports its CPU time per unit
// (per op, or per decision when a batch does per decisions an op).
func cpuMetric(b *testing.B, per int, loop func()) {
	b.Helper()
	c0 := cpuNow()
	loop()
	b.ReportMetric(float64((cpuNow()-c0).Nanoseconds())/float64(b.N*per), "cpu-ns/op")
}

// BenchmarkIssue41 is issue 41's paired before/after measure (BENCHMARKS.md):
// one decision through wazero (the scalar ABI, bench/decide_test.go's
// workloads), per decision in a batch, the native core as a control, and
// start-up (host.New to a first decision, cold and with the compilation
// cache). It uses only API that both trees have, so the file is copied into
// the before tree unchanged.
func BenchmarkIssue41(b *testing.B) {
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
	native, _ := policy.Preset("default")
	for _, w := range []struct {
		name string
		fs   []policy.Failure
	}{{"transient", transient}, {"mixed", mixed}} {
		fs := w.fs
		b.Run("wasm-scalar/"+w.name, func(b *testing.B) {
			cpuMetric(b, 1, func() {
				for i := 0; b.Loop(); i++ {
					if _, err := p.Decide(ctx, fs[i&1023]); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
		b.Run("wasm-batch/"+w.name, func(b *testing.B) {
			out := make([]policy.Decision, 0, len(fs))
			cpuMetric(b, len(fs), func() {
				for b.Loop() {
					if out, err = p.DecideBatch(ctx, fs, out[:0]); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(fs)), "ns/decision")
		})
		b.Run("native/"+w.name, func(b *testing.B) {
			cpuMetric(b, 1, func() {
				for i := 0; b.Loop(); i++ {
					native.Decide(fs[i&1023])
				}
			})
		})
	}
	start := func(b *testing.B, opts ...host.Option) {
		rt, err := host.New(ctx, opts...)
		if err != nil {
			b.Fatal(err)
		}
		p, _ := rt.Preset(ctx, "default")
		if _, err := p.Decide(ctx, policy.Failure{Attempt: 1, HTTPStatus: 503}); err != nil {
			b.Fatal(err)
		}
		rt.Close(ctx)
	}
	b.Run("startup/cold", func(b *testing.B) {
		cpuMetric(b, 1, func() {
			for b.Loop() {
				start(b, host.WithPoolSize(1))
			}
		})
	})
	b.Run("startup/cached", func(b *testing.B) {
		dir := b.TempDir()
		start(b, host.WithCompilationCache(dir)) // fill the cache
		cpuMetric(b, 1, func() {
			for b.Loop() {
				start(b, host.WithCompilationCache(dir), host.WithPoolSize(1))
			}
		})
	})
}
