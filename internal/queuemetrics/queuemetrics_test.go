package queuemetrics

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The first TypeLimit valid types are labelled by name, the rest and the
// invalid ones "other"; a second Bind reuses the queue's Recorder.
func TestJobTypeLimit(t *testing.T) {
	reg := prometheus.NewRegistry()
	r, err := Bind(reg, "q", "test")
	if err != nil {
		t.Fatal(err)
	}
	for i := range TypeLimit + 5 {
		r.Success(Job{Type: fmt.Sprintf("t%d", i), ValidType: true, Attempt: 1})
	}
	r.Success(Job{Type: "bad type", Attempt: 2})
	r.Success(Job{Attempt: 1})
	again, err := Bind(reg, "q", "test")
	if err != nil || again != r {
		t.Fatalf("second Bind = %p, %v; want the same Recorder", again, err)
	}
	again.Success(Job{Type: "t0", ValidType: true, Attempt: 1})
	if got := testutil.ToFloat64(r.f.attempts.WithLabelValues("q", "t0", Success)); got != 2 {
		t.Errorf("t0 = %v, want 2", got)
	}
	if got := testutil.ToFloat64(r.f.attempts.WithLabelValues("q", Other, Success)); got != 6 {
		t.Errorf("other = %v, want 6 (5 past the limit, 1 invalid)", got)
	}
	if got := testutil.ToFloat64(r.f.attempts.WithLabelValues("q", "", Success)); got != 1 {
		t.Errorf("untyped = %v, want 1", got)
	}
	if n := testutil.CollectAndCount(reg, "backstop_attempts_total"); n != TypeLimit+2 {
		t.Errorf("%d series, want %d", n, TypeLimit+2)
	}
	r.DeadLettered(Job{Attempt: 7}, "max_attempts_reached")
	r.DeadLettered(Job{}, "malformed") // attempt unknown: not observed
	if got := testutil.ToFloat64(r.f.maxAttempts.WithLabelValues("q", "")); got != 1 {
		t.Errorf("max attempts = %v, want 1", got)
	}
	if n := testutil.CollectAndCount(reg, "backstop_job_attempts"); n != TypeLimit+3 {
		t.Errorf("job_attempts has %d series, want %d", n, TypeLimit+3)
	}
}

func TestBindErrors(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "backstop_retries_total"}))
	for _, c := range []struct {
		reg   prometheus.Registerer
		queue string
		want  string
	}{
		{nil, "q", "registerer"}, {prometheus.NewRegistry(), "", "queue"}, {prometheus.NewRegistry(), "\xff", "UTF-8"},
		{reg, "q", "backstop_retries_total"},
	} {
		if _, err := Bind(c.reg, c.queue, "who"); err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "who: ") {
			t.Errorf("Bind(%v, %q) = %v, want an error about %s", c.reg, c.queue, err, c.want)
		}
	}
}
