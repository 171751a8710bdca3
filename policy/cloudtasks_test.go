package policy_test

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/backstop-dev/backstop/policy"
)

// The table is the example of Cloud Tasks' RetryConfig reference
// (max_doublings): min_backoff 10s, max_backoff 300s, max_doublings 3
// retry at 10s, 20s, 40s, 80s, 160s, 240s, 300s, 300s…: three doublings,
// then +2^3 × 10s per retry, then the cap.
func TestCloudTasksScheduleMatchesTheReference(t *testing.T) {
	p := mustParse(t, `{"max_attempts": 10, "backoff": {"strategy": "cloud_tasks", "base": "10s", "cap": "300s", "max_doublings": 3}, "jitter": {"mode": "none"}}`)
	want := []int64{10_000, 20_000, 40_000, 80_000, 160_000, 240_000, 300_000, 300_000, 300_000}
	for i, w := range want {
		attempt := int64(i + 1)
		d := mustDecide(t, p, policy.Failure{Attempt: attempt, HTTPStatus: 503})
		if d.Action != policy.Retry || d.DelayMs != w {
			t.Errorf("attempt %d: got %s %dms, want retry %dms", attempt, d.Action, d.DelayMs, w)
		}
	}
	if d := mustDecide(t, p, policy.Failure{Attempt: 10, HTTPStatus: 503}); d.Reason != policy.MaxAttemptsReached {
		t.Errorf("attempt 10: got %s/%s, want dead_letter/max_attempts_reached", d.Action, d.Reason)
	}
}

// Written out from the same rules: Cloud Tasks' defaults (0.1s, 3600s, 16
// doublings) reach 6553.6s on the 17th retry, past the cap; with 2
// doublings of 1s the linear part adds 4s a retry.
func TestCloudTasksScheduleOtherShapes(t *testing.T) {
	for _, c := range []struct {
		pol  string
		want []int64
	}{
		{`{"backoff": {"strategy": "cloud_tasks", "base": "100ms", "cap": "3600s", "max_doublings": 16}, "max_attempts": 100, "jitter": {"mode": "none"}}`,
			[]int64{100, 200, 400, 800, 1600, 3200, 6400, 12_800, 25_600, 51_200, 102_400, 204_800, 409_600, 819_200, 1_638_400, 3_276_800, 3_600_000, 3_600_000}},
		{`{"backoff": {"strategy": "cloud_tasks", "base": "1s", "cap": "30s", "max_doublings": 2}, "max_attempts": 100, "jitter": {"mode": "none"}}`,
			[]int64{1000, 2000, 4000, 8000, 12_000, 16_000, 20_000, 24_000, 28_000, 30_000, 30_000}},
		{`{"backoff": {"strategy": "cloud_tasks", "base": "5s", "cap": "60s", "max_doublings": 0}, "max_attempts": 100, "jitter": {"mode": "none"}}`,
			[]int64{5000, 10_000, 15_000, 20_000, 25_000, 30_000, 35_000, 40_000, 45_000, 50_000, 55_000, 60_000, 60_000}},
	} {
		p := mustParse(t, c.pol)
		for i, w := range c.want {
			if got := p.Backoff(int64(i+1), 0, 0.5); got != w {
				t.Errorf("%s: retry %d: got %dms, want %dms", c.pol, i+1, got, w)
			}
		}
	}
}

// Past the doublings the wait grows by a product: it saturates at the cap
// for any attempt number instead of overflowing.
func TestCloudTasksNeverOverflows(t *testing.T) {
	p := mustParse(t, `{"max_attempts": 0, "max_elapsed": "2000000h", "backoff": {"strategy": "cloud_tasks", "base": "1ms", "cap": "2000000h", "max_doublings": 40}, "jitter": {"mode": "none"}}`)
	const capMs = 2_000_000 * 3_600_000
	for _, a := range []int64{41, 42, 1 << 20, 1 << 40, 1 << 62, math.MaxInt64} {
		got := p.Backoff(a, 0, 0)
		if got <= 0 || got > capMs {
			t.Errorf("attempt %d: got %dms, want in (0, %d]", a, got, int64(capMs))
		}
	}
	if got := p.Backoff(math.MaxInt64, 0, 0); got != capMs {
		t.Errorf("attempt MaxInt64: got %dms, want the cap %d", got, int64(capMs))
	}
	// 2^40 ms a step: retry 42 waits two steps.
	if got := p.Backoff(42, 0, 0); got != 2<<40 {
		t.Errorf("attempt 42: got %d, want %d", got, int64(2<<40))
	}
}

func TestCloudTasksRejectsAMultiplier(t *testing.T) {
	_, err := policy.Parse([]byte(`{"backoff": {"strategy": "cloud_tasks", "multiplier": 1.5}}`))
	if err == nil || !strings.Contains(err.Error(), "backoff.multiplier: must be 2 with strategy cloud_tasks") {
		t.Fatalf("got %v, want an error naming backoff.multiplier", err)
	}
}

// Cloud Tasks stops retrying only when max_attempts and max_retry_duration
// are both satisfied: stop_when all keeps retrying past either limit alone.
func TestStopWhenAllNeedsEveryLimit(t *testing.T) {
	const limits = `"max_attempts": 3, "max_elapsed": "60s", "backoff": {"strategy": "cloud_tasks", "base": "10s", "cap": "300s", "max_doublings": 3}, "jitter": {"mode": "none"}`
	all := mustParse(t, `{`+limits+`, "stop_when": "all"}`)
	anyLimit := mustParse(t, `{`+limits+`}`)
	for _, c := range []struct {
		attempt, elapsedMs int64
		all, any           string
	}{
		{2, 10_000, "retry/transient/20000", "retry/transient/20000"},
		// Attempts used up, time left: Cloud Tasks retries.
		{3, 30_000, "retry/transient/40000", "dead_letter/max_attempts_reached/0"},
		{5, 59_000, "retry/transient/160000", "dead_letter/max_attempts_reached/0"},
		// Time passed, attempts left: Cloud Tasks retries too.
		{2, 61_000, "retry/transient/20000", "dead_letter/max_elapsed_exceeded/0"},
		// A retry due past the deadline: any stops before it, all does not.
		{1, 55_000, "retry/transient/10000", "dead_letter/max_elapsed_exceeded/0"},
		// Both passed.
		{3, 61_000, "dead_letter/max_attempts_reached/0", "dead_letter/max_attempts_reached/0"},
	} {
		for _, pc := range []struct {
			p    *policy.Policy
			want string
		}{{all, c.all}, {anyLimit, c.any}} {
			d := mustDecide(t, pc.p, policy.Failure{Attempt: c.attempt, ElapsedMs: c.elapsedMs, HTTPStatus: 503})
			if got := fmt.Sprintf("%s/%s/%d", d.Action, d.Reason, d.DelayMs); got != pc.want {
				t.Errorf("%v attempt %d elapsed %dms: got %s, want %s", pc.p, c.attempt, c.elapsedMs, got, pc.want)
			}
		}
	}
	// Unlimited attempts: max elapsed alone stops, once passed.
	p := mustParse(t, `{"max_attempts": 0, "max_elapsed": "60s", "stop_when": "all", "backoff": {"strategy": "cloud_tasks", "base": "10s", "cap": "300s"}, "jitter": {"mode": "none"}}`)
	if d := mustDecide(t, p, policy.Failure{Attempt: 50, ElapsedMs: 60_000, HTTPStatus: 503}); d.Action != policy.Retry {
		t.Errorf("unlimited attempts at the deadline: got %s/%s, want a retry", d.Action, d.Reason)
	}
	if d := mustDecide(t, p, policy.Failure{Attempt: 50, ElapsedMs: 60_001, HTTPStatus: 503}); d.Reason != policy.MaxElapsedExceeded {
		t.Errorf("unlimited attempts past the deadline: got %s/%s, want max_elapsed_exceeded", d.Action, d.Reason)
	}
}

func TestStopWhenAllSchedule(t *testing.T) {
	p := mustParse(t, `{"max_attempts": 3, "max_elapsed": "60s", "stop_when": "all", "backoff": {"strategy": "cloud_tasks", "base": "10s", "cap": "300s", "max_doublings": 3}, "jitter": {"mode": "none"}}`)
	// Waits 10, 20, 40: after the third failure 70s have passed and three
	// attempts are used up.
	var got []int64
	for _, s := range p.Schedule(100) {
		got = append(got, s.MinMs)
	}
	if fmt.Sprint(got) != "[10000 20000 40000]" {
		t.Errorf("schedule: got %v, want [10000 20000 40000]", got)
	}
}
