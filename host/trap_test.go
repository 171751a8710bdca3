package host_test

import (
	"context"
	"errors"
	"testing"

	"github.com/backstop-dev/backstop/host"
	"github.com/backstop-dev/backstop/policy"
)

// A trap retires only the instance it happened in. Stateless policies
// carry on (reloaded from their bytes in a fresh instance), new loads get a
// fresh instance, and a stateful policy whose budget and breaker lived in
// the trapped instance gets ErrStateLost on every call, rather than the
// trap's error forever or decisions from a broken Go runtime.
func TestTrapRetiresOnlyItsInstance(t *testing.T) {
	ctx := context.Background()
	// 32 MiB per instance: a 40 MiB buffer runs the module out of memory,
	// a real trap (the Go runtime's "out of memory" exit) that costs
	// nothing to cause.
	rt, err := host.New(ctx, host.SharedCache(), host.WithPoolSize(1), host.WithMemoryLimit(512))
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	f := policy.Failure{Attempt: 1, HTTPStatus: 503, NowMs: 1_700_000_000_000, Random: 0.5}
	stateless, _ := rt.Preset(ctx, "default")
	stateful, err := rt.Load(ctx, []byte(statefulPolicy))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []*host.Policy{stateless, stateful} {
		if _, err := p.Decide(ctx, f); err != nil {
			t.Fatal(err)
		}
	}

	if err := host.GrowBuffer(ctx, rt, 40<<20); err == nil {
		t.Fatal("a 40 MiB buffer in 32 MiB of memory did not fail")
	} else {
		t.Logf("the trap: %v", err)
	}

	for range 2 { // the same error every time
		if _, err := stateful.Decide(ctx, f); !errors.Is(err, host.ErrStateLost) {
			t.Errorf("stateful Decide after the trap: %v, want ErrStateLost", err)
		}
		if _, err := stateful.DecideBatch(ctx, []policy.Failure{f}, nil); !errors.Is(err, host.ErrStateLost) {
			t.Errorf("stateful DecideBatch after the trap: %v, want ErrStateLost", err)
		}
		if err := stateful.RecordSuccess(ctx, f.NowMs); !errors.Is(err, host.ErrStateLost) {
			t.Errorf("stateful RecordSuccess after the trap: %v, want ErrStateLost", err)
		}
		if _, err := stateful.CircuitState(ctx, f.NowMs); !errors.Is(err, host.ErrStateLost) {
			t.Errorf("stateful CircuitState after the trap: %v, want ErrStateLost", err)
		}
		if _, err := stateful.Acquire(ctx, f.NowMs); !errors.Is(err, host.ErrStateLost) {
			t.Errorf("stateful Acquire after the trap: %v, want ErrStateLost", err)
		}
		if _, err := stateful.Outcome(ctx, policy.JobEvent{Event: policy.EventFailure, Failure: f}); !errors.Is(err, host.ErrStateLost) {
			t.Errorf("stateful Outcome after the trap: %v, want ErrStateLost", err)
		}
	}
	if err := stateful.Close(ctx); err != nil {
		t.Errorf("Close of a lost policy: %v", err)
	}

	if _, err := stateless.Decide(ctx, f); err != nil {
		t.Errorf("a stateless policy loaded before the trap: %v", err)
	}
	fresh, err := rt.Preset(ctx, "default")
	if err != nil {
		t.Fatalf("a new load after the trap: %v", err)
	}
	if _, err := fresh.Decide(ctx, f); err != nil {
		t.Errorf("a policy loaded after the trap: %v", err)
	}
	again, err := rt.Load(ctx, []byte(statefulPolicy))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := again.Decide(ctx, f); err != nil {
		t.Errorf("a stateful policy loaded after the trap: %v", err)
	}
}
