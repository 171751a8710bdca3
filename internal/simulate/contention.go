package simulate

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/backstop-dev/backstop/policy"
)

// ContentionResult is the mean outcome of the contention experiment for
// one policy and one number of clients.
type ContentionResult struct {
	Policy  string // the policy's name
	Clients int
	Runs    int
	// Calls is the mean number of writes per run: the work, counted as
	// the published experiment counts it (reads are not counted).
	Calls float64
	// CompletionMs is the mean time until the last client's write landed.
	CompletionMs float64
	// GaveUp is the mean number of clients per run the policy stopped.
	GaveUp float64
	// Events counts the events simulated over all runs.
	Events int
}

// The four steps of one optimistic-concurrency attempt.
const (
	readArrives  uint8 = iota // the read reaches the row: take its version
	readReturns               // the version is back: send the write
	writeArrives              // the write lands if the version still matches
	writeReturns              // done, or a conflict for the policy to decide
)

// Contention runs the optimistic-concurrency experiment of "Exponential
// Backoff And Jitter" (Marc Brooker, AWS Architecture Blog, 2015) with the
// policy src: clients all start at once, each reads the version of one
// row and writes it back; the write fails when another write landed in
// between, and the client backs off as the policy decides (a gRPC ABORTED
// failure, retryable) and tries again from the read. Every message takes
// a network delay (WithNetwork); the result is the mean of WithRuns runs.
//
// The PRNG is seeded from the seed and the number of clients, so every
// policy compared at one point starts from the same state.
//
// # Errors
//
// Clients must be in 1..MaxClients and WithRuns in 1..MaxRuns. A policy
// that never lets go stops after 20 million events, and one whose delays
// would overflow the virtual clock (microseconds) stops too.
func Contention(src []byte, clients int, opts ...Option) (ContentionResult, error) {
	c, err := newConfig(clients, opts)
	if err != nil {
		return ContentionResult{}, err
	}
	p, err := policy.Load(src)
	if err != nil {
		return ContentionResult{}, fmt.Errorf("simulate: %w", err)
	}
	res := ContentionResult{Policy: p.Name(), Clients: clients, Runs: c.runs}
	rng := rand.New(rand.NewPCG(c.seed, uint64(clients)))
	mean, sd := float64(c.netMeanUs), float64(c.netSDUs)
	net := func() int64 { return int64(math.Abs(mean + sd*rng.NormFloat64())) }

	type client struct {
		attempt, prevDelayMs, version int64
		ok                            bool
	}
	cl := make([]client, clients)
	q := queue{ev: make([]event, 0, clients)}
	var calls, gaveUp int64
	var endUs float64 // the sum of the runs' times: float, as a sum of long runs overflows int64
	for run := range c.runs {
		if run > 0 && p.Stateful() {
			p, _ = policy.Load(src) // a fresh budget and breaker for every run
		}
		q.reset()
		clear(cl)
		version := int64(0)
		for i := range cl {
			q.push(net(), int32(i), readArrives)
		}
		var now int64
		for !q.empty() {
			e := q.pop()
			now, res.Events = e.at, res.Events+1
			if res.Events > maxEvents {
				return res, fmt.Errorf("simulate: stopped after %d events: the policy retries without a limit that bites", maxEvents)
			}
			s := &cl[e.id]
			switch e.kind {
			case readArrives:
				s.version = version
				q.push(now+net(), e.id, readReturns)
			case readReturns:
				q.push(now+net(), e.id, writeArrives)
			case writeArrives:
				calls++
				if s.ok = s.version == version; s.ok {
					version++
				}
				q.push(now+net(), e.id, writeReturns)
			case writeReturns:
				if s.ok {
					continue
				}
				s.attempt++
				d, err := p.Decide(policy.Failure{Attempt: s.attempt, GRPCCode: 10, // ABORTED
					ElapsedMs: now / 1000, NowMs: epochMs + now/1000, Random: rng.Float64(), PrevDelayMs: s.prevDelayMs})
				if err != nil {
					return res, fmt.Errorf("simulate: %w", err) // a bug: every input here is in range
				}
				if d.Action != policy.Retry {
					gaveUp++
					continue
				}
				at, ok := after(now+net(), d.DelayMs*1000) // DelayMs*1000 <= 2^63/1000: a Duration in ms
				if !ok {
					return res, errClock
				}
				s.prevDelayMs = d.DelayMs
				q.push(at, e.id, readArrives)
			}
		}
		endUs += float64(now)
	}
	runs := float64(c.runs)
	res.Calls = float64(calls) / runs
	res.CompletionMs = endUs / 1000 / runs
	res.GaveUp = float64(gaveUp) / runs
	return res, nil
}

// JitterPolicies returns the four policies the published experiment
// compares, as policy files: exponential backoff capped at 2s with no,
// full and equal jitter, and decorrelated jitter; attempts are unlimited
// (within an hour), as there. The experiment's backoff is min(cap,
// 2^n × 5ms) for the n-th retry, so its first retry waits up to 10ms:
// that is backstop's base (the first retry's delay), so the exponential
// policies use base 10ms. Decorrelated jitter starts from the base itself,
// U(5ms, 15ms), and keeps base 5ms.
func JitterPolicies() [][]byte {
	const exp = `{"name": %q, "max_attempts": 0, "max_elapsed": "1h",
 "backoff": {"strategy": "exponential", "base": "10ms", "multiplier": 2, "cap": "2s"},
 "jitter": {"mode": %q}}`
	return [][]byte{
		fmt.Appendf(nil, exp, "no jitter", "none"),
		fmt.Appendf(nil, exp, "full jitter", "full"),
		fmt.Appendf(nil, exp, "equal jitter", "equal"),
		[]byte(`{"name": "decorrelated jitter", "max_attempts": 0, "max_elapsed": "1h",
 "backoff": {"strategy": "decorrelated", "base": "5ms", "cap": "2s"},
 "jitter": {"mode": "decorrelated"}}`),
	}
}
