package simulate

import (
	"testing"
	"time"
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

// The contention clock counts microseconds: a policy whose retries wait
// 292 years wrapped it after about a thousand rounds (negative times, the
// run reordered), and the sum of many runs' times wrapped the mean
// completion negative. Now a run that would overflow stops with an error,
// and the mean is right however many runs.
func TestContentionClockDoesNotOverflow(t *testing.T) {
	centuries := []byte(`{"max_attempts": 3000, "backoff": {"strategy": "constant", "base": "2562047h", "cap": "2562047h"}, "jitter": {"mode": "none"}}`)
	// Without network noise the clients move in step and one write wins a
	// round: 1100 clients take 1100 rounds.
	_, err := Contention(centuries, 1100, WithRuns(1), WithNetwork(10*time.Millisecond, 0))
	if err == nil || err.Error() != "simulate: stopped: the virtual clock would overflow (the policy's delays are too long to simulate)" {
		t.Errorf("1100 clients in step: %v", err)
	}
	// Two clients: one write wins, the other retries once, 292 years later.
	r := contention(t, centuries, 2, WithRuns(2000))
	if r.CompletionMs < 9.2e12 || r.CompletionMs > 9.3e12 || r.Calls != 3 {
		t.Errorf("2 clients, 2000 runs: completion %.0fms, %v writes; want one retry's 2562047h", r.CompletionMs, r.Calls)
	}
}
