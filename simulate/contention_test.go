package simulate

import (
	"testing"
)

func contention(t *testing.T, src []byte, clients int, opts ...Option) ContentionResult {
	t.Helper()
	r, err := Contention(src, clients, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// The published result: without jitter, clients collide again and again;
// full jitter cuts the work.
func TestContentionNoJitterDoesMoreWork(t *testing.T) {
	ps := JitterPolicies()
	none, full := contention(t, ps[0], 50), contention(t, ps[1], 50)
	if none.Policy != "no jitter" || full.Policy != "full jitter" {
		t.Fatalf("policies %q, %q", none.Policy, full.Policy)
	}
	if none.Calls <= full.Calls*1.3 {
		t.Errorf("50 clients: no jitter %.1f writes, full jitter %.1f: want clearly more without jitter", none.Calls, full.Calls)
	}
	if none.CompletionMs <= full.CompletionMs {
		t.Errorf("50 clients: no jitter done in %.0fms, full jitter %.0fms", none.CompletionMs, full.CompletionMs)
	}
}

func TestContentionEveryClientWritesOnce(t *testing.T) {
	for _, src := range JitterPolicies() {
		r := contention(t, src, 20, WithRuns(10))
		// Each client's last write succeeds and every write bumps the
		// version at most once, so a run takes at least 20 writes.
		if r.GaveUp != 0 || r.Calls < 20 || r.Runs != 10 || r.Clients != 20 {
			t.Errorf("%s: %+v", r.Policy, r)
		}
	}
}

func TestContentionIsDeterministicForASeed(t *testing.T) {
	src := JitterPolicies()[3] // decorrelated: the chain of previous delays too
	a, b := contention(t, src, 30, WithRuns(10), WithSeed(3)), contention(t, src, 30, WithRuns(10), WithSeed(3))
	if a != b {
		t.Fatalf("seed 3 twice: %+v and %+v", a, b)
	}
	if c := contention(t, src, 30, WithRuns(10), WithSeed(4)); c == a {
		t.Fatal("seeds 3 and 4 gave the same result")
	}
}
