package host_test

import (
	"context"
	"os"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/backstop-dev/backstop/host"
	"github.com/backstop-dev/backstop/policy"
)

func TestDecideDoesNotAllocate(t *testing.T) {
	ctx := context.Background()
	p, _ := runtime(t).Preset(ctx, "default")
	defer p.Close(ctx)
	f := policy.Failure{Attempt: 2, HTTPStatus: 429, Method: "GET", RetryAfter: "3", Random: 0.5}
	if n := testing.AllocsPerRun(1000, func() { p.Decide(ctx, f) }); n != 0 {
		t.Errorf("Decide allocates %v times per call", n)
	}
}

func BenchmarkDecide(b *testing.B) {
	ctx := context.Background()
	rt := runtime(b)
	plain := policy.Failure{Attempt: 2, HTTPStatus: 503, NowMs: 1_700_000_000_000, Random: 0.5}
	strs := policy.Failure{Attempt: 2, HTTPStatus: 429, Method: "POST", IdempotencyKey: "k",
		ErrorKind: "timeout", RetryAfter: "3", NowMs: 1_700_000_000_000, Random: 0.5}
	for _, bc := range []struct {
		name   string
		policy string
		f      policy.Failure
	}{
		{"scalars", "default", plain},
		{"strings", "default", strs},
		{"stateful", statefulPolicy, plain},
	} {
		p, err := rt.Load(ctx, []byte(bc.policy))
		if err != nil {
			b.Fatal(err)
		}
		b.Run("wasm/"+bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := p.Decide(ctx, bc.f); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("wasm-parallel/"+bc.name, func(b *testing.B) {
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					p.Decide(ctx, bc.f)
				}
			})
		})
		native, _ := policy.Load([]byte(bc.policy))
		b.Run("native/"+bc.name, func(b *testing.B) {
			for b.Loop() {
				native.Decide(bc.f)
			}
		})
		p.Close(ctx)
	}
}

func TestOutcomeDoesNotAllocate(t *testing.T) {
	ctx := context.Background()
	p, err := runtime(t).Load(ctx, []byte(statefulPolicy))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)
	f := policy.Failure{Attempt: 2, HTTPStatus: 429, Method: "GET", RetryAfter: "3", Random: 0.5, NowMs: 1_700_000_000_000}
	if n := testing.AllocsPerRun(1000, func() {
		p.Outcome(ctx, policy.JobEvent{Event: policy.EventBefore, Failure: policy.Failure{NowMs: f.NowMs}})
		p.Outcome(ctx, policy.JobEvent{Event: policy.EventFailure, Failure: f})
		p.Outcome(ctx, policy.JobEvent{Event: policy.EventSuccess, Failure: policy.Failure{NowMs: f.NowMs}})
	}); n != 0 {
		t.Errorf("Outcome allocates %v times per job", n)
	}
}

// BenchmarkOutcome asks the outcome of one event per op, as a worker does
// around each job: the failure of a job (as BenchmarkDecide's scalars),
// and on a stateful policy the gate before it and a success.
func BenchmarkOutcome(b *testing.B) {
	ctx := context.Background()
	rt := runtime(b)
	const now = 1_700_000_000_000
	failed := policy.JobEvent{Event: policy.EventFailure,
		Failure: policy.Failure{Attempt: 2, HTTPStatus: 503, IdempotencyKey: "job-1", NowMs: now, Random: 0.5}}
	for _, bc := range []struct {
		name   string
		policy string
		e      policy.JobEvent
	}{
		{"failure", "default", failed},
		{"failure-stateful", statefulPolicy, failed},
		{"before-stateful", statefulPolicy, policy.JobEvent{Event: policy.EventBefore, Failure: policy.Failure{NowMs: now}}},
		{"success-stateful", statefulPolicy, policy.JobEvent{Event: policy.EventSuccess, Failure: policy.Failure{NowMs: now}}},
	} {
		p, err := rt.Load(ctx, []byte(bc.policy))
		if err != nil {
			b.Fatal(err)
		}
		b.Run("wasm/"+bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := p.Outcome(ctx, bc.e); err != nil {
					b.Fatal(err)
				}
			}
		})
		native, _ := policy.Load([]byte(bc.policy))
		b.Run("native/"+bc.name, func(b *testing.B) {
			for b.Loop() {
				native.Outcome(bc.e)
			}
		})
		p.Close(ctx)
	}
}

// BenchmarkDecideBatch decides 4,096 failures per op: "plain" ones (a
// status code, no strings) and the varied ones of the parity tests (methods,
// error kinds, Retry-After dates and garbage).
func BenchmarkDecideBatch(b *testing.B) {
	ctx := context.Background()
	p, _ := runtime(b).Preset(ctx, "default")
	defer p.Close(ctx)
	plain := make([]policy.Failure, 4096)
	for i := range plain {
		plain[i] = policy.Failure{Attempt: int64(i%5 + 1), HTTPStatus: 503, NowMs: 1_700_000_000_000, Random: 0.5}
	}
	for _, bc := range []struct {
		name string
		fs   []policy.Failure
	}{{"plain", plain}, {"mixed", failures(1, 4096)}} {
		b.Run(bc.name, func(b *testing.B) {
			out := make([]policy.Decision, 0, len(bc.fs))
			b.ReportAllocs()
			for b.Loop() {
				var err error
				if out, err = p.DecideBatch(ctx, bc.fs, out[:0]); err != nil {
					b.Fatal(err)
				}
			}
			perDecision := float64(b.Elapsed().Nanoseconds()) / float64(b.N*len(bc.fs))
			b.ReportMetric(perDecision, "ns/decision")
			b.ReportMetric(1e9/perDecision, "decisions/s")
		})
	}
}

// BenchmarkStartup measures New up to a first decision: compiling the
// module (cold) or loading it from a compilation cache (cached).
func BenchmarkStartup(b *testing.B) {
	ctx := context.Background()
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
	b.Run("cold", func(b *testing.B) {
		for b.Loop() {
			start(b, host.WithPoolSize(1))
		}
	})
	b.Run("cached", func(b *testing.B) {
		dir := b.TempDir()
		start(b, host.WithCompilationCache(dir)) // fill the cache
		for b.Loop() {
			start(b, host.WithCompilationCache(dir), host.WithPoolSize(1))
		}
	})
}

// BenchmarkInstance measures instantiating one more module instance (what a
// pool does on demand) and reports its linear memory after _initialize and
// after loading every preset and deciding.
func BenchmarkInstance(b *testing.B) {
	ctx := context.Background()
	wasm, err := os.ReadFile("../contract/backstop.wasm")
	if err != nil {
		b.Fatal(err)
	}
	rt := wazero.NewRuntime(ctx)
	defer rt.Close(ctx)
	wasi_snapshot_preview1.MustInstantiate(ctx, rt)
	cm, err := rt.CompileModule(ctx, wasm)
	if err != nil {
		b.Fatal(err)
	}
	cfg := wazero.NewModuleConfig().WithName("").WithStartFunctions("_initialize")
	var size uint32
	for b.Loop() {
		mod, err := rt.InstantiateModule(ctx, cm, cfg)
		if err != nil {
			b.Fatal(err)
		}
		size = mod.Memory().Size()
		mod.Close(ctx)
	}
	b.ReportMetric(float64(size)/(1<<20), "MiB/instance")

	// After use: a Runtime of one instance, every preset loaded.
	hrt, err := host.New(ctx, host.SharedCache(), host.WithPoolSize(1))
	if err != nil {
		b.Fatal(err)
	}
	defer hrt.Close(ctx)
	for _, name := range policy.PresetNames() {
		p, _ := hrt.Preset(ctx, name)
		p.DecideBatch(ctx, failures(2, 4096), nil)
	}
	b.ReportMetric(float64(host.MemorySize(hrt))/(1<<20), "MiB/instance-used")
}
