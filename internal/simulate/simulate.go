// Package simulate runs retry policies against a simulated dependency, in
// virtual time, so their effect on it can be seen before production.
//
// Two experiments:
//
//   - Herd: many clients fail at the same moment against a dependency that
//     is down for a while and then serves a fixed number of calls per
//     second; each client retries with the policy. It shows the herd of
//     retries the dependency sees, who finishes when, who gives up and why.
//   - Contention: the optimistic-concurrency experiment of "Exponential
//     Backoff And Jitter" (AWS Architecture Blog, 2015): clients race to
//     update one row; the work done and the time taken depend on the
//     jitter.
//
// Every decision goes through the native policy core (policy.Decide), so a
// simulation shows what the policy itself would do, budget and circuit
// breaker included. Randomness comes from one PRNG seeded by WithSeed and
// events at the same instant run in the order they were scheduled, so a
// seed replays the same run exactly.
package simulate

import (
	"fmt"
	"time"
)

// Option sets a knob of a simulation. Options that do not apply to a
// simulation are ignored by it.
type Option func(*config)

type config struct {
	seed uint64

	// herd
	processes  int // 0: one per 100 clients
	capacity   int64
	recoveryMs int64

	// contention
	runs      int
	netMeanUs int64
	netSDUs   int64
}

// maxEvents stops a run whose policy never lets go (no backoff and no
// limit that bites): better an error than a simulation that never ends.
const maxEvents = 20_000_000

// Bounds of the knobs. A simulation allocates per client up front, and
// the herd's dependency counts its tokens in milli-calls: these keep both
// far above any real use and far below what would exhaust memory or
// overflow. A value outside them is an error naming the knob.
const (
	// MaxClients bounds the clients of a herd or of one contention point.
	MaxClients = 1_000_000
	// MaxCapacity bounds the herd's dependency, in calls per second.
	MaxCapacity = 1_000_000_000
	// MaxRuns bounds the contention runs averaged per point.
	MaxRuns = 10_000
)

// defaults are the knobs every simulation starts from.
var defaults = config{
	seed:       1,
	capacity:   200,
	recoveryMs: 5000,
	runs:       100,
	netMeanUs:  10_000,
	netSDUs:    2_000,
}

// WithSeed seeds the PRNG (default 1). The same seed gives the same run.
func WithSeed(seed uint64) Option { return func(c *config) { c.seed = seed } }

// WithProcesses spreads the herd's clients round-robin over n policy
// instances. The clients of one instance share its retry budget and circuit
// breaker, as the requests of one service process do. Default: one
// instance per 100 clients.
func WithProcesses(n int) Option { return func(c *config) { c.processes = n } }

// WithCapacity sets how many calls per second the herd's dependency serves
// once it has recovered (default 200, at most MaxCapacity). It admits a burst of a tenth of a
// second's worth; calls beyond that are shed with a 503.
func WithCapacity(callsPerSecond int) Option {
	return func(c *config) { c.capacity = int64(callsPerSecond) }
}

// WithRecovery sets how long the herd's dependency stays down after the
// failure that starts the simulation (default 5s). Until then every call
// fails with a 503.
func WithRecovery(d time.Duration) Option {
	return func(c *config) { c.recoveryMs = d.Milliseconds() }
}

// WithRuns sets how many contention runs are averaged (default 100, at
// most MaxRuns).
func WithRuns(n int) Option { return func(c *config) { c.runs = n } }

// WithNetwork sets the contention experiment's one-way network delay: the
// absolute value of a normal draw with this mean and standard deviation
// (default 10ms ± 2ms, as in the published experiment).
func WithNetwork(mean, sd time.Duration) Option {
	return func(c *config) { c.netMeanUs, c.netSDUs = mean.Microseconds(), sd.Microseconds() }
}

func newConfig(clients int, opts []Option) (config, error) {
	c := defaults
	for _, o := range opts {
		o(&c)
	}
	if c.processes == 0 {
		c.processes = (clients + 99) / 100
	}
	switch {
	case clients < 1 || clients > MaxClients:
		return c, fmt.Errorf("simulate: clients must be in 1..%d (got %d)", MaxClients, clients)
	case c.processes < 1 || c.processes > clients:
		return c, fmt.Errorf("simulate: processes must be in 1..clients (got %d for %d clients)", c.processes, clients)
	case c.capacity < 1 || c.capacity > MaxCapacity:
		return c, fmt.Errorf("simulate: capacity must be in 1..%d calls per second (got %d)", MaxCapacity, c.capacity)
	case c.recoveryMs < 0:
		return c, fmt.Errorf("simulate: recovery must be >= 0 (got %dms)", c.recoveryMs)
	case c.runs < 1 || c.runs > MaxRuns:
		return c, fmt.Errorf("simulate: runs must be in 1..%d (got %d)", MaxRuns, c.runs)
	case c.netMeanUs < 0 || c.netSDUs < 0:
		return c, fmt.Errorf("simulate: network delay must be >= 0 (got mean %dµs, sd %dµs)", c.netMeanUs, c.netSDUs)
	}
	return c, nil
}

// epochMs is virtual time zero as a Unix time: a policy with a budget or a
// breaker needs a real now_ms (0 means "unknown" to the core).
const epochMs = 1767225600000
