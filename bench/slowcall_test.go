package bench

import (
	"context"
	"testing"
	"time"

	"github.com/backstop-dev/backstop/host"
	"github.com/backstop-dev/backstop/policy"
)

// BenchmarkRecordDuration is what the slow-call rate (issue 43) adds to
// each attempt of a retry loop or a worker's run on a stateful policy: a
// monotonic clock read and one RecordDuration, natively and through
// wazero, for a breaker without a slow-call rate (nothing to count) and
// one with it (a window to count in). Decide is not on this path.
func BenchmarkRecordDuration(b *testing.B) {
	const t0 = 1767225600000
	srcs := map[string]string{
		"consecutive": `{"circuit_breaker": {"failure_threshold": 5}}`,
		"slow_call":   `{"circuit_breaker": {"type": "failure_rate", "slow_call_rate_threshold": 100, "slow_call_duration_threshold": "1h", "sliding_window": {"size": 100}}}`,
	}
	ctx := context.Background()
	rt, err := host.New(ctx, host.WithPoolSize(1))
	if err != nil {
		b.Fatal(err)
	}
	defer rt.Close(ctx)
	for _, name := range []string{"consecutive", "slow_call"} {
		p, err := policy.Parse([]byte(srcs[name]))
		if err != nil {
			b.Fatal(err)
		}
		b.Run("native/"+name, func(b *testing.B) {
			start := time.Now()
			for i := 0; i < b.N; i++ {
				if err := p.RecordDuration(t0+int64(i), time.Since(start).Milliseconds()); err != nil {
					b.Fatal(err)
				}
			}
		})
		hp, err := rt.Load(ctx, []byte(srcs[name]))
		if err != nil {
			b.Fatal(err)
		}
		b.Run("wazero/"+name, func(b *testing.B) {
			start := time.Now()
			for i := 0; i < b.N; i++ {
				if err := hp.RecordDuration(ctx, t0+int64(i), time.Since(start).Milliseconds()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
