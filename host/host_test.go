package host_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/backstop-dev/backstop/host"
	"github.com/backstop-dev/backstop/policy"
)

var (
	sharedOnce sync.Once
	shared     *host.Runtime
	sharedErr  error
)

// runtime returns a Runtime shared by the tests: compiling the module is
// the slow part, and sharing it also checks that policies stay apart.
func runtime(t testing.TB) *host.Runtime {
	t.Helper()
	sharedOnce.Do(func() { shared, sharedErr = host.New(context.Background(), host.SharedCache(), host.WithPoolSize(4)) })
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return shared
}

// statefulPolicy has a token-bucket budget and a breaker, so decisions
// depend on the order of the calls.
const statefulPolicy = `{
  "max_attempts": 8,
  "retry_budget": {"type": "token_bucket", "max_tokens": 6, "token_ratio": 0.5},
  "circuit_breaker": {"failure_threshold": 4, "open_for": "2s", "half_open_successes": 1}
}`

// failures returns n varied failures: every classification path, hints of
// both kinds (good, past, garbage, absurd), methods with and without keys.
func failures(seed uint64, n int) []policy.Failure {
	rng := rand.New(rand.NewPCG(seed, 1))
	pick := func(xs ...string) string { return xs[rng.IntN(len(xs))] }
	now := int64(1_700_000_000_000)
	out := make([]policy.Failure, n)
	for i := range out {
		now += rng.Int64N(1500)
		f := policy.Failure{
			Attempt:     1 + rng.Int64N(12),
			ElapsedMs:   rng.Int64N(30_000),
			NowMs:       now,
			Random:      rng.Float64(),
			PrevDelayMs: rng.Int64N(5000),
			ErrorKind:   pick("", "", "timeout", "connection_refused", "invalid_input", "deadlock", "mystery"),
			Method:      pick("", "GET", "POST", "patch", "DELETE"),
		}
		switch rng.IntN(3) {
		case 0:
			f.HTTPStatus = []int{408, 429, 500, 502, 503, 504, 400, 404, 409, 418}[rng.IntN(10)]
		case 1:
			f.GRPCCode = rng.IntN(17)
		}
		if rng.IntN(3) == 0 {
			f.IdempotencyKey = "job-42"
		}
		switch rng.IntN(4) {
		case 0:
			f.RetryAfter = pick("3", "0", "120", "7200", "9999999999", "-5", "soon",
				"Wed, 21 Oct 2015 07:28:00 GMT", "Tue, 14 Nov 2023 22:14:20 GMT")
		case 1:
			f.RetryPushback = pick("250", "0", "-1", "99999999999", "x")
		}
		out[i] = f
	}
	return out
}

func TestDecideMatchesNative(t *testing.T) {
	ctx := context.Background()
	rt := runtime(t)
	sources := append(policy.PresetNames(), statefulPolicy,
		`{"backoff": {"strategy": "decorrelated", "base": "50ms", "cap": "20s"}, "jitter": {"mode": "decorrelated"}}`,
		"max_attempts: 4\nbackoff: {strategy: linear, base: 200ms, cap: 1s}\njitter: {mode: proportional, ratio: 0.2}\n")
	for i, src := range sources {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			native, err := policy.Load([]byte(src))
			if err != nil {
				t.Fatal(err)
			}
			p, err := rt.Load(ctx, []byte(src))
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close(ctx)
			if p.Stateful() != native.Stateful() {
				t.Fatalf("Stateful = %v, native %v", p.Stateful(), native.Stateful())
			}
			for j, f := range failures(uint64(i), 400) {
				want, _ := native.Decide(f)
				got, err := p.Decide(ctx, f)
				if err != nil || got != want {
					t.Fatalf("failure %d %+v: got %v (%v), want %v", j, f, got, err, want)
				}
				if j%7 == 0 { // successes move the budget and the breaker
					native.RecordSuccess(f.NowMs)
					if err := p.RecordSuccess(ctx, f.NowMs); err != nil {
						t.Fatal(err)
					}
				}
				st, err := p.CircuitState(ctx, f.NowMs)
				if err != nil || st != native.CircuitState(f.NowMs) {
					t.Fatalf("failure %d: circuit %v (%v), want %v", j, st, err, native.CircuitState(f.NowMs))
				}
			}
		})
	}
}

func TestDecideBatchMatchesDecide(t *testing.T) {
	ctx := context.Background()
	rt := runtime(t)
	fs := failures(7, 10_000) // several decide_batch calls
	// Strings at the limit (65535 bytes: longer ones are refused, see
	// TestHostChecksMatchTheSharedInputs) fit a batch record.
	fs[5].RetryAfter = strings.Repeat(" ", 65_534) + "5"
	fs[9000].ErrorKind = strings.Repeat("k", 65_535)
	fs[9001].Method = strings.Repeat("m", 65_535)
	for _, src := range []string{"default", statefulPolicy} {
		scalar, _ := rt.Load(ctx, []byte(src))
		batch, _ := rt.Load(ctx, []byte(src))
		prefix := []policy.Decision{{DelayMs: 1}}
		got, err := batch.DecideBatch(ctx, fs, prefix)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(fs)+1 || got[0] != prefix[0] {
			t.Fatalf("DecideBatch returned %d decisions, did not append", len(got))
		}
		for i, f := range fs {
			want, err := scalar.Decide(ctx, f)
			if err != nil || got[i+1] != want {
				t.Fatalf("%s: failure %d: batch %v, scalar %v (%v)", src, i, got[i+1], want, err)
			}
		}
		scalar.Close(ctx)
		batch.Close(ctx)
	}
}

func TestBadPolicy(t *testing.T) {
	ctx := context.Background()
	rt := runtime(t)
	for src, field := range map[string]string{
		`{"backoff": {"base": "1s", "cap": "100ms"}}`:        "backoff.cap",
		`{"max_attempts": "three"}`:                          "max_attempts",
		"retry_budget: {type: bucket}\n":                     "retry_budget.type",
		`{"circuit_breaker": {"failure_threshold": 0}}`:      "circuit_breaker.failure_threshold",
		`{"backoff": {"strategy": "exponential", "wat": 1}}`: "backoff.wat",
	} {
		_, err := rt.Load(ctx, []byte(src))
		var pe *host.PolicyError
		if !errors.As(err, &pe) || !strings.Contains(pe.Message, field) {
			t.Errorf("Load(%s) = %v, want a PolicyError naming %s", src, err, field)
		}
	}
	_, err := rt.Preset(ctx, "nope")
	var pe *host.PolicyError
	if !errors.As(err, &pe) || !strings.Contains(err.Error(), `unknown preset "nope"`) {
		t.Errorf("Preset(nope) = %v", err)
	}
	path := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(path, []byte("jitter: {mode: sometimes}\n"), 0o644)
	_, err = rt.LoadFile(ctx, path)
	if !errors.As(err, &pe) || !strings.Contains(err.Error(), path+": invalid policy: jitter.mode") {
		t.Errorf("LoadFile = %v", err)
	}
}

func TestLoadFileAndPreset(t *testing.T) {
	ctx := context.Background()
	rt := runtime(t)
	path := filepath.Join(t.TempDir(), "p.yaml")
	os.WriteFile(path, []byte("extends: critical\nmax_attempts: 2\n"), 0o644)
	p, err := rt.LoadFile(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	d, err := p.Decide(ctx, policy.Failure{Attempt: 2, HTTPStatus: 503})
	if err != nil || d.Reason != policy.MaxAttemptsReached {
		t.Errorf("Decide = %v, %v", d, err)
	}
	if _, err := rt.LoadFile(ctx, filepath.Join(t.TempDir(), "missing.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("LoadFile(missing) = %v", err)
	}
	q, err := rt.Preset(ctx, "batch")
	if err != nil {
		t.Fatal(err)
	}
	d, err = q.Decide(ctx, policy.Failure{Attempt: 2, HTTPStatus: 503})
	if err != nil || d.Action != policy.Retry {
		t.Errorf("Decide = %v, %v", d, err)
	}
}

func TestBadInputDoesNotTrap(t *testing.T) {
	ctx := context.Background()
	rt := runtime(t)
	for _, src := range []string{"default", statefulPolicy} {
		p, err := rt.Load(ctx, []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			f     policy.Failure
			field string
		}{
			{policy.Failure{Attempt: 0, HTTPStatus: 503}, "attempt"},
			{policy.Failure{Attempt: 1, GRPCCode: 99}, "grpc_code"},
			{policy.Failure{Attempt: 1, HTTPStatus: 1<<32 + 503}, "http_status"}, // must not wrap to 503
			{policy.Failure{Attempt: 1, HTTPStatus: 503, NowMs: -1}, "now_ms"},
		} {
			_, err := p.Decide(ctx, tc.f)
			var ie *host.InputError
			var native *policy.InputError
			if !errors.As(err, &ie) || ie.Index != -1 || !errors.As(err, &native) || native.Field != tc.field {
				t.Errorf("Decide(%+v) = %v, want an InputError for %s", tc.f, err, tc.field)
			}
			// Still usable afterwards.
			if _, err := p.Decide(ctx, policy.Failure{Attempt: 1, HTTPStatus: 503, NowMs: 1767225600000}); err != nil {
				t.Fatalf("after a bad input: %v", err)
			}
		}
		// In a batch: every valid failure is decided, the first bad one named.
		const now = 1767225600000
		fs := []policy.Failure{{Attempt: 1, HTTPStatus: 503, NowMs: now}, {Attempt: 0, NowMs: now}, {Attempt: 1, GRPCCode: 14, NowMs: now}, {Attempt: -3, NowMs: now}}
		got, err := p.DecideBatch(ctx, fs, nil)
		var ie *host.InputError
		if !errors.As(err, &ie) || ie.Index != 1 || !strings.HasPrefix(ie.Message, "invalid failure: attempt:") ||
			err.Error() != "failures[1]: "+ie.Message {
			t.Fatalf("DecideBatch error = %v", err)
		}
		if len(got) != 4 || got[0].Class != policy.Retryable || got[2].Class != policy.Retryable || got[1] != (policy.Decision{}) {
			t.Errorf("DecideBatch = %v", got)
		}
		p.Close(ctx)
	}
}

func TestPoliciesDoNotShareState(t *testing.T) {
	ctx := context.Background()
	rt := runtime(t)
	a, _ := rt.Load(ctx, []byte(statefulPolicy))
	b, _ := rt.Load(ctx, []byte(statefulPolicy))
	for i := 0; i < 4; i++ {
		a.Decide(ctx, policy.Failure{Attempt: 1, HTTPStatus: 503, NowMs: 1000})
	}
	if s, _ := a.CircuitState(ctx, 1000); s != policy.BreakerOpen {
		t.Errorf("a: %v, want open", s)
	}
	if s, _ := b.CircuitState(ctx, 1000); s != policy.BreakerClosed {
		t.Errorf("b: %v, want closed", s)
	}
}

func TestClose(t *testing.T) {
	ctx := context.Background()
	rt, err := host.New(ctx, host.SharedCache(), host.WithPoolSize(1))
	if err != nil {
		t.Fatal(err)
	}
	p, _ := rt.Preset(ctx, "default")
	s, _ := rt.Load(ctx, []byte(statefulPolicy))
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Decide(ctx, policy.Failure{Attempt: 1}); !errors.Is(err, host.ErrClosed) {
		t.Errorf("Decide after Close = %v", err)
	}
	// Freed handles are reused: loading and closing many policies does not
	// fill the module's handle table.
	for i := 0; i < 1000; i++ {
		q, err := rt.Preset(ctx, "critical")
		if err != nil {
			t.Fatal(err)
		}
		q.Close(ctx)
	}
	if err := rt.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Decide(ctx, policy.Failure{Attempt: 1}); !errors.Is(err, host.ErrClosed) {
		t.Errorf("Decide after Runtime.Close = %v", err)
	}
	if _, err := rt.Preset(ctx, "default"); !errors.Is(err, host.ErrClosed) {
		t.Errorf("Preset after Runtime.Close = %v", err)
	}
}

func TestOptions(t *testing.T) {
	ctx := context.Background()
	if _, err := host.New(ctx, host.WithPoolSize(0)); err == nil || !strings.Contains(err.Error(), "pool size") {
		t.Errorf("WithPoolSize(0): %v", err)
	}
	if _, err := host.New(ctx, host.WithModule([]byte("not wasm"))); err == nil {
		t.Error("WithModule(garbage) accepted")
	}
}

// Policies are cut one byte past policy.MaxFileBytes before they reach the
// module, so any oversized input, a file or bytes, gets the module's own
// PolicyError, never a buffer error, and costs no more than the limit.
func TestOversizedPolicy(t *testing.T) {
	ctx := context.Background()
	rt := runtime(t)
	fits := append([]byte("{}"), bytes.Repeat([]byte(" "), policy.MaxFileBytes-2)...)
	if _, err := rt.Load(ctx, fits); err != nil {
		t.Fatalf("a policy of exactly %d bytes: %v", policy.MaxFileBytes, err)
	}
	path := filepath.Join(t.TempDir(), "huge.json")
	huge := append([]byte("{}"), bytes.Repeat([]byte(" "), 65<<20)...)
	if err := os.WriteFile(path, huge, 0o644); err != nil {
		t.Fatal(err)
	}
	for name, load := range map[string]func() (*host.Policy, error){
		"one byte over": func() (*host.Policy, error) { return rt.Load(ctx, append(fits, ' ')) },
		"65 MiB":        func() (*host.Policy, error) { return rt.Load(ctx, huge) },
		"65 MiB file":   func() (*host.Policy, error) { return rt.LoadFile(ctx, path) },
	} {
		_, err := load()
		var pe *host.PolicyError
		if !errors.As(err, &pe) || !strings.Contains(err.Error(), "must be at most 65536 bytes") {
			t.Errorf("%s: %v, want the module's PolicyError", name, err)
		}
	}
	if pages := host.MemorySize(rt) / (64 << 10); pages > 1024 {
		t.Errorf("loading 65 MiB policies left %d pages of memory", pages)
	}
}
