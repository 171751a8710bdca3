package bench

import (
	"testing"

	"github.com/backstop-dev/backstop/internal/simulate"
)

// BenchmarkSimulate measures the simulators in client events per second:
// in the herd an event is one call of one client, its failure decided by
// the policy; in the contention experiment one step of an attempt (the
// read, its reply, the write, its reply, with a decision after a
// conflict). Each op is a whole simulation.
func BenchmarkSimulate(b *testing.B) {
	herd := func(src string) func(b *testing.B) {
		return func(b *testing.B) {
			events := 0
			for b.Loop() {
				r, err := simulate.Herd([]byte(src), 1000)
				if err != nil {
					b.Fatal(err)
				}
				events += r.Calls
			}
			b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
		}
	}
	b.Run("herd/1000-clients/default", herd("default"))
	// A budget and a breaker: every decision takes the policy's lock.
	b.Run("herd/1000-clients/budget+breaker", herd(`{"max_attempts": 8,
		"retry_budget": {"type": "ratio", "ratio": 0.5, "window": "10s"},
		"circuit_breaker": {"failure_threshold": 50, "open_for": "1s"}}`))

	names := []string{"none", "full", "equal", "decorrelated"}
	for i, src := range simulate.JitterPolicies() {
		b.Run("contention/50-clients/"+names[i]+"-jitter", func(b *testing.B) {
			events := 0
			for b.Loop() {
				r, err := simulate.Contention(src, 50, simulate.WithRuns(10))
				if err != nil {
					b.Fatal(err)
				}
				events += r.Events
			}
			b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
		})
	}
}
