package simulate

import (
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/backstop-dev/backstop/policy"
)

// noJitter is the default preset without its jitter: every client waits
// exactly 1s, 2s, 4s, 8s.
var noJitter = []byte(`{"name": "no jitter", "jitter": {"mode": "none"}}`)

func herd(t *testing.T, src []byte, clients int, opts ...Option) *HerdResult {
	t.Helper()
	r, err := Herd(src, clients, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestHerdIsDeterministicForASeed(t *testing.T) {
	a := herd(t, []byte("default"), 1000, WithSeed(7))
	b := herd(t, []byte("default"), 1000, WithSeed(7))
	if !reflect.DeepEqual(a, b) {
		t.Fatal("two runs with seed 7 differ")
	}
	c := herd(t, []byte("default"), 1000, WithSeed(8))
	if reflect.DeepEqual(a.Buckets(100), c.Buckets(100)) || reflect.DeepEqual(a.CompletionMs, c.CompletionMs) {
		t.Fatal("seeds 7 and 8 gave the same run")
	}
}

// The point of jitter: the same simultaneous failure, with full jitter,
// never sends the dependency more than a small fraction of the retries
// no jitter sends in one bucket.
func TestFullJitterSpreadsTheHerd(t *testing.T) {
	peak := func(r *HerdResult) int {
		top := 0
		for _, b := range r.Buckets(100) {
			top = max(top, b.Retries)
		}
		return top
	}
	full, none := herd(t, []byte("default"), 1000), herd(t, noJitter, 1000)
	if none := peak(none); none != 1000 {
		t.Errorf("no jitter: peak %d retries in 100ms, want all 1000 clients at once", none)
	}
	if ratio := float64(peak(full)) / float64(peak(none)); ratio >= 0.25 {
		t.Errorf("full jitter peak is %.2f of no jitter's, want < 0.25", ratio)
	}
	if full.Succeeded() <= none.Succeeded() {
		t.Errorf("full jitter served %d clients, no jitter %d: want more with jitter", full.Succeeded(), none.Succeeded())
	}
}

func TestHerdCountsAndReasons(t *testing.T) {
	r := herd(t, noJitter, 1000)
	// Down for 5s: attempts at 0, 1s, 3s fail; at 7s and 15s the bucket
	// serves its burst of 20 and sheds the rest; attempt 5 is the last.
	if r.Calls != 1000+1000+1000+1000+980 || r.Retries != r.Calls-1000 {
		t.Errorf("calls %d, retries %d", r.Calls, r.Retries)
	}
	if r.Succeeded() != 40 || r.Shed != 1940 || r.EndMs != 15_000 {
		t.Errorf("succeeded %d, shed %d, end %dms", r.Succeeded(), r.Shed, r.EndMs)
	}
	want := []ReasonCount{{policy.MaxAttemptsReached, 960}}
	if !reflect.DeepEqual(r.GaveUp, want) || len(r.GaveUpMs) != 960 {
		t.Errorf("gave up %v (%d times)", r.GaveUp, len(r.GaveUpMs))
	}
	if p50, p99 := r.Percentile(0.5), r.Percentile(0.99); p50 != 7000 || p99 != 15_000 {
		t.Errorf("p50 %d, p99 %d", p50, p99)
	}
	total := 0
	for _, b := range r.Buckets(1000) {
		total += b.Calls
	}
	if total != r.Calls {
		t.Errorf("buckets hold %d calls of %d", total, r.Calls)
	}
}

func TestHerdUpDependencyServesFirstAttempts(t *testing.T) {
	r := herd(t, []byte("default"), 50, WithRecovery(0), WithCapacity(10_000))
	if r.Calls != 50 || r.Succeeded() != 50 || len(r.GaveUp) != 0 {
		t.Errorf("calls %d, succeeded %d, gave up %v", r.Calls, r.Succeeded(), r.GaveUp)
	}
}

// A process's clients share its budget and breaker: they stop the herd
// (at the price of giving up), and each process trips its own breaker.
func TestHerdBudgetAndBreaker(t *testing.T) {
	guarded := []byte(`{"max_attempts": 8, "backoff": {"base": "200ms", "cap": "10s"},
		"retry_budget": {"max_tokens": 20, "token_ratio": 0.5},
		"circuit_breaker": {"failure_threshold": 20, "open_for": "2s"}}`)
	r := herd(t, guarded, 1000, WithProcesses(10))
	plain := herd(t, []byte(`{"max_attempts": 8, "backoff": {"base": "200ms", "cap": "10s"}}`), 1000, WithProcesses(10))
	if r.Retries >= plain.Retries/10 {
		t.Errorf("budget and breaker let %d retries through, %d without them", r.Retries, plain.Retries)
	}
	reasons := map[policy.Reason]int{}
	for _, g := range r.GaveUp {
		reasons[g.Reason] = g.Clients
	}
	if reasons[policy.BudgetExhausted] == 0 || reasons[policy.CircuitOpen] == 0 {
		t.Errorf("gave up: %v, want budget_exhausted and circuit_open", r.GaveUp)
	}
	if r.BreakerTrips != 10 {
		t.Errorf("%d breaker trips, want one per process (10)", r.BreakerTrips)
	}
}

func TestHerdRejectsBadOptions(t *testing.T) {
	for name, run := range map[string]func() error{
		"clients":   func() error { _, err := Herd([]byte("default"), 0); return err },
		"processes": func() error { _, err := Herd([]byte("default"), 10, WithProcesses(11)); return err },
		"capacity":  func() error { _, err := Herd([]byte("default"), 10, WithCapacity(0)); return err },
		"recovery":  func() error { _, err := Herd([]byte("default"), 10, WithRecovery(-time.Second)); return err },
		"policy":    func() error { _, err := Herd([]byte("max_attempts: -1"), 10); return err },
	} {
		if err := run(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestAutoBucket(t *testing.T) {
	for span, want := range map[int64]int64{0: 1, 59: 1, 60: 2, 12_659: 500, 15_000: 500, 86_400_000: 2_000_000} {
		if got := AutoBucket(span); got != want {
			t.Errorf("AutoBucket(%d) = %d, want %d", span, got, want)
		}
	}
}

// centuries is a policy whose every retry waits as long as a
// time.Duration allows (292 years).
var centuries = []byte(`{"max_attempts": 3, "backoff": {"strategy": "constant", "base": "2562047h", "cap": "2562047h"}, "jitter": {"mode": "none"}}`)

// Issue 15 (class of item 11): every knob that sizes an allocation is
// bounded, with an error naming it; a million and one clients was a
// simulation of its own, two billion an allocation of tens of GB.
func TestKnobsAreBounded(t *testing.T) {
	for _, c := range []struct {
		run  func() error
		want string
	}{
		{func() error { _, err := Herd([]byte("default"), MaxClients+1); return err }, "simulate: clients must be in 1..1000000 (got 1000001)"},
		{func() error { _, err := Herd([]byte("default"), 2_000_000_000); return err }, "simulate: clients must be in 1..1000000 (got 2000000000)"},
		{func() error { _, err := Contention([]byte("default"), MaxClients+1, WithRuns(1)); return err }, "simulate: clients must be in 1..1000000 (got 1000001)"},
		{func() error { _, err := Contention([]byte("default"), 2, WithRuns(MaxRuns+1)); return err }, "simulate: runs must be in 1..10000 (got 10001)"},
		{func() error { _, err := Herd([]byte("default"), 10, WithCapacity(MaxCapacity+1)); return err }, "simulate: capacity must be in 1..1000000000 calls per second (got 1000000001)"},
	} {
		if err := c.run(); err == nil || err.Error() != c.want {
			t.Errorf("%v, want %s", err, c.want)
		}
	}
}

// A width of 1ms over a run that lasts centuries asked for one bucket per
// millisecond (9.2e12 of them); Buckets widens it to at most MaxBuckets.
func TestBucketsAreBounded(t *testing.T) {
	r := herd(t, centuries, 1)
	if r.EndMs != 9_223_369_200_000 || r.Succeeded() != 1 {
		t.Fatalf("end %dms, succeeded %d", r.EndMs, r.Succeeded())
	}
	for _, width := range []int64{1, 1000, r.EndMs / MaxBuckets} {
		bs := r.Buckets(width)
		if len(bs) > MaxBuckets || len(bs) < MaxBuckets-1 || bs[1].StartMs != r.EndMs/MaxBuckets+1 || bs[len(bs)-1].Calls != 1 {
			t.Errorf("width %d: %d buckets of %dms", width, len(bs), bs[1].StartMs)
		}
	}
	if bs := r.Buckets(AutoBucket(r.EndMs)); len(bs) > 60 {
		t.Errorf("AutoBucket: %d buckets", len(bs))
	}
	// A short run keeps the width it asks for, up to MaxBuckets buckets.
	short := herd(t, noJitter, 1000) // ends at 15s
	if bs := short.Buckets(2); len(bs) != 7501 || bs[1].StartMs != 2 {
		t.Errorf("15s in 2ms buckets: %d of %dms", len(bs), bs[1].StartMs)
	}
	if bs := short.Buckets(1); len(bs) != 7501 || bs[1].StartMs != 2 {
		t.Errorf("15s in 1ms buckets: %d of %dms, want 2ms, the narrowest width for 10000", len(bs), bs[1].StartMs)
	}
	// AutoBucket terminates and cuts the longest span there is into about 60.
	for _, span := range []int64{math.MaxInt64, math.MaxInt64 / 2, 1 << 62} {
		if w := AutoBucket(span); w <= 0 || span/w+1 > 61 {
			t.Errorf("AutoBucket(%d) = %d: %d buckets", span, w, span/w+1)
		}
	}
}

// A dependency with a large capacity, after a long gap, refilled its bucket
// with gap × capacity: 9.2e12 ms × 1e9 wrapped negative and shed every call.
func TestCapacityRefillDoesNotOverflow(t *testing.T) {
	r := herd(t, centuries, 1, WithCapacity(MaxCapacity))
	if r.Succeeded() != 1 || r.Shed != 0 || r.Calls != 2 {
		t.Errorf("succeeded %d, shed %d, calls %d: want the retry after the recovery served", r.Succeeded(), r.Shed, r.Calls)
	}
}
