package simulate_test

import (
	"strings"
	"testing"
	"time"

	"github.com/backstop-dev/backstop/internal/simulate"
)

func TestLayersAmplification(t *testing.T) {
	rows, err := simulate.Layers([]byte("default"), 4, simulate.WithRecovery(24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	want := int64(1)
	for _, r := range rows {
		want *= 5 // the default preset's attempts
		if r.Without.BottomCalls != want || r.With.BottomCalls != 5 || r.Without.Succeeded || r.With.Succeeded {
			t.Errorf("%d layers: %+v without, %+v with; want %d and 5 calls, both failed", r.Layers, r.Without, r.With, want)
		}
		if r.Layers > 1 && (r.With.Reason.String() != "retried_downstream" || r.With.EndMs >= r.Without.EndMs) {
			t.Errorf("%d layers: with the rule %s at %dms, want retried_downstream sooner than %dms", r.Layers, r.With.Reason, r.With.EndMs, r.Without.EndMs)
		}
	}
}

func TestLayersOptedOutAndRecovering(t *testing.T) {
	src := []byte(`{"max_attempts": 3, "jitter": {"mode": "none"}, "backoff": {"strategy": "constant", "base": "1s"}, "retried_downstream": "retry"}`)
	rows, err := simulate.Layers(src, 3, simulate.WithRecovery(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if r := rows[2]; r.With != r.Without || r.With.BottomCalls != 27 {
		t.Fatalf("opted out: %+v with, %+v without; want the same 27 calls", r.With, r.Without)
	}
	// The bottom is back after 1.5s: the innermost loop's third attempt
	// (at 2s) gets through, whichever rule.
	rows, err = simulate.Layers([]byte(`{"max_attempts": 3, "jitter": {"mode": "none"}, "backoff": {"strategy": "constant", "base": "1s"}}`), 3,
		simulate.WithRecovery(1500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if r := rows[2]; !r.With.Succeeded || !r.Without.Succeeded || r.With.BottomCalls != 3 || r.With.EndMs != 2000 {
		t.Fatalf("recovering: %+v with, %+v without; want both through after 3 calls at 2s", r.With, r.Without)
	}
}

func TestLayersBadInput(t *testing.T) {
	for _, tc := range []struct {
		src    string
		layers int
		opts   []simulate.Option
		want   string
	}{
		{"default", 0, nil, "layers must be in 1..10 (got 0)"},
		{"default", 11, nil, "layers must be in 1..10 (got 11)"},
		{"default", 2, []simulate.Option{simulate.WithRecovery(-time.Second)}, "recovery must be >= 0"},
		{`{"max_attempts": "many"}`, 2, nil, "max_attempts"},
	} {
		if _, err := simulate.Layers([]byte(tc.src), tc.layers, tc.opts...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Layers(%s, %d) = %v, want an error with %q", tc.src, tc.layers, err, tc.want)
		}
	}
}
