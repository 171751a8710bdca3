package simulate

import (
	"fmt"
	"math/rand/v2"
	"sort"

	"github.com/backstop-dev/backstop/policy"
)

// HerdResult is what the dependency and the clients saw in a herd
// simulation. Times are virtual milliseconds since the failure that
// started it.
type HerdResult struct {
	Policy         string // the policy's name
	Clients        int
	Processes      int
	CapacityPerSec int64
	RecoveryMs     int64

	Calls   int // calls to the dependency, first attempts included
	Retries int // calls made after a retry decision
	Shed    int // calls refused for capacity after the recovery
	// CompletionMs holds, in order, when each client that succeeded had
	// its answer.
	CompletionMs []int64
	// GaveUp counts the clients the policy stopped, by reason, most first;
	// GaveUpMs holds, in order, when each of them was stopped.
	GaveUp   []ReasonCount
	GaveUpMs []int64
	// BreakerTrips counts the times a process's circuit breaker opened.
	BreakerTrips int
	// EndMs is when the last client succeeded or gave up.
	EndMs int64

	calls []callRecord
}

// ReasonCount is how many clients gave up for one reason.
type ReasonCount struct {
	Reason  policy.Reason
	Clients int
}

type callRecord struct {
	atMs      int64
	retry, ok bool
}

// Bucket counts the calls the dependency received in one slice of time.
type Bucket struct {
	StartMs int64
	Calls   int // all calls
	Retries int // calls after a retry decision
	OK      int // calls served
}

// Herd simulates clients that all fail at the same moment (t = 0) against
// a dependency that is down until the recovery time and then serves a
// fixed capacity, each client retrying with the policy src (a preset name
// or a policy file, as policy.Load takes it) until it succeeds or the
// policy gives up. See WithProcesses, WithCapacity, WithRecovery, WithSeed.
//
// Every failure is a 503 decided by the policy; every success is reported
// to it with RecordSuccess, so retry budgets and circuit breakers act as
// they would in production.
//
// # Errors
//
// Clients must be in 1..MaxClients, and the options in their ranges. A
// policy that never lets go stops the run after 20 million calls, and one
// whose delays would overflow the virtual clock stops it too.
func Herd(src []byte, clients int, opts ...Option) (*HerdResult, error) {
	c, err := newConfig(clients, opts)
	if err != nil {
		return nil, err
	}
	procs := make([]*policy.Policy, c.processes)
	for i := range procs {
		if i > 0 && !procs[0].Stateful() {
			procs[i] = procs[0] // no state to keep apart: one parse will do
			continue
		}
		if procs[i], err = policy.Load(src); err != nil {
			return nil, fmt.Errorf("simulate: %w", err)
		}
	}
	res := &HerdResult{Policy: procs[0].Name(), Clients: clients, Processes: c.processes,
		CapacityPerSec: c.capacity, RecoveryMs: c.recoveryMs}
	rng := rand.New(rand.NewPCG(c.seed, 0x6865726400000000)) // "herd": a stream of its own
	dep := newDependency(c.recoveryMs, c.capacity)
	type client struct{ attempt, prevDelayMs int64 }
	cl := make([]client, clients)
	gaveUp := map[policy.Reason]int{}
	q := queue{ev: make([]event, 0, clients)}
	for i := range cl {
		q.push(0, int32(i), 0)
	}
	res.calls = make([]callRecord, 0, 4*clients)
	for !q.empty() {
		if len(res.calls) > maxEvents {
			return nil, fmt.Errorf("simulate: stopped after %d calls: the policy retries without a limit that bites", maxEvents)
		}
		e := q.pop()
		now, s, p := e.at, &cl[e.id], procs[int(e.id)%len(procs)]
		s.attempt++
		ok, shed := dep.call(now)
		res.calls = append(res.calls, callRecord{atMs: now, retry: s.attempt > 1, ok: ok})
		if shed {
			res.Shed++
		}
		if ok {
			p.RecordSuccess(epochMs + now)
			res.CompletionMs = append(res.CompletionMs, now)
			res.EndMs = now
			continue
		}
		wasOpen := p.Stateful() && p.CircuitState(now) == policy.BreakerOpen
		d, err := p.Decide(policy.Failure{Attempt: s.attempt, HTTPStatus: 503, ElapsedMs: now,
			NowMs: epochMs + now, Random: rng.Float64(), PrevDelayMs: s.prevDelayMs})
		if err != nil {
			return nil, fmt.Errorf("simulate: %w", err) // a bug: every input here is in range
		}
		if !wasOpen && p.Stateful() && p.CircuitState(now) == policy.BreakerOpen {
			res.BreakerTrips++
		}
		if d.Action == policy.Retry {
			at, ok := after(now, d.DelayMs)
			if !ok {
				return nil, errClock
			}
			s.prevDelayMs = d.DelayMs
			q.push(at, e.id, 0)
			continue
		}
		gaveUp[d.Reason]++
		res.GaveUpMs = append(res.GaveUpMs, now)
		res.EndMs = now
	}
	res.Calls = len(res.calls)
	for _, r := range res.calls {
		if r.retry {
			res.Retries++
		}
	}
	for r, n := range gaveUp {
		res.GaveUp = append(res.GaveUp, ReasonCount{Reason: r, Clients: n})
	}
	sort.Slice(res.GaveUp, func(i, j int) bool {
		a, b := res.GaveUp[i], res.GaveUp[j]
		return a.Clients > b.Clients || (a.Clients == b.Clients && a.Reason < b.Reason)
	})
	return res, nil
}

// MaxBuckets bounds the buckets Buckets returns: a table longer than
// anyone reads, a chart wider than it can draw, and the allocation stays
// small however long the run.
const MaxBuckets = 10_000

// Buckets returns the calls per slice of widthMs, from 0 to EndMs, empty
// slices included: the herd as the dependency sees it.
//
// # Notes
//
// A width that would cut the run into more than MaxBuckets slices (1ms
// over a run of hours) is widened to the narrowest that does not, so the
// result never holds more than MaxBuckets; the StartMs of the second
// bucket is the width used. AutoBucket gives a round width of about 60.
func (r *HerdResult) Buckets(widthMs int64) []Bucket {
	widthMs = max(widthMs, r.EndMs/MaxBuckets+1, 1)
	out := make([]Bucket, r.EndMs/widthMs+1)
	for i := range out {
		out[i].StartMs = int64(i) * widthMs
	}
	for _, c := range r.calls {
		b := &out[c.atMs/widthMs]
		b.Calls++
		if c.retry {
			b.Retries++
		}
		if c.ok {
			b.OK++
		}
	}
	return out
}

// Percentile returns the completion time below which a fraction q of the
// clients that succeeded had their answer (nearest rank), 0 when none did.
func (r *HerdResult) Percentile(q float64) int64 {
	n := len(r.CompletionMs)
	if n == 0 {
		return 0
	}
	i := int(q*float64(n)+0.999999) - 1
	return r.CompletionMs[min(max(i, 0), n-1)]
}

// Succeeded returns how many clients got their answer.
func (r *HerdResult) Succeeded() int { return len(r.CompletionMs) }

// AutoBucket returns a round bucket width (1, 2 or 5 × 10^k ms) that cuts
// spanMs into at most about 60 buckets: enough to see the herd's shape,
// few enough to read as a table.
func AutoBucket(spanMs int64) int64 {
	for w := int64(1); ; w *= 10 {
		for _, m := range []int64{1, 2, 5} {
			if spanMs/(w*m) < 60 {
				return w * m
			}
		}
	}
}

// dependency is down until recoveryMs, then serves capacity calls per
// second through a token bucket that holds a tenth of a second's worth:
// a recovered service absorbs a small burst, not a herd. Amounts are in
// milli-calls so a refill of one millisecond is exact.
type dependency struct {
	recoveryMs, rate, burst int64
	tokens, lastMs          int64
}

func newDependency(recoveryMs, capacity int64) *dependency {
	burst := max(1, capacity/10) * 1000
	return &dependency{recoveryMs: recoveryMs, rate: capacity, burst: burst, tokens: burst, lastMs: recoveryMs}
}

// call reports whether a call at nowMs is served, and whether it was shed
// for capacity (as opposed to failing because the dependency is down).
func (d *dependency) call(nowMs int64) (ok, shed bool) {
	if nowMs < d.recoveryMs {
		return false, false
	}
	// capacity calls per second is capacity milli-calls per millisecond;
	// a gap long enough to fill the bucket fills it (and the product of a
	// long gap and a large capacity cannot overflow).
	if gap := nowMs - d.lastMs; gap >= (d.burst-d.tokens)/d.rate+1 {
		d.tokens = d.burst
	} else {
		d.tokens += gap * d.rate
	}
	d.lastMs = nowMs
	if d.tokens < 1000 {
		return false, true
	}
	d.tokens -= 1000
	return true, false
}
