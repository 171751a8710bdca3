package policy

import "math/bits"

type strategy uint8

const (
	strategyNone strategy = iota
	strategyConstant
	strategyLinear
	strategyExponential
	strategyDecorrelated
	strategyCloudTasks
)

var strategyNames = []string{"none", "constant", "linear", "exponential", "decorrelated", "cloud_tasks"}

type jitterMode uint8

const (
	jitterNone jitterMode = iota
	jitterFull
	jitterEqual
	jitterProportional
	jitterDecorrelated
)

var jitterNames = []string{"none", "full", "equal", "proportional", "decorrelated"}

// Backoff returns the jittered delay in milliseconds before the retry that
// follows a failure of the given attempt, ignoring classification, limits
// and Retry-After. It is what Decide uses, exposed for schedules and plots.
//
// All arithmetic is on integer milliseconds and saturates at the cap, so no
// attempt number, however large, overflows or yields a negative delay. The
// random draw enters in one multiply-and-floor (see scale), which gives the
// same bits natively and in WebAssembly.
func (p *Policy) Backoff(attempt, prevDelayMs int64, random float64) int64 {
	r := clampUnit(random)
	n := attempt - 1 // retries so far; the first retry waits base
	if n < 0 {
		n = 0
	}
	var d int64
	switch p.strategy {
	case strategyNone:
		return 0
	case strategyConstant:
		d = p.baseMs
	case strategyLinear:
		d = satMul(p.baseMs, satAdd(n, 1))
	case strategyExponential:
		d = p.exponential(min(n, p.maxDoublings))
	case strategyCloudTasks:
		d = p.cloudTasks(n)
	case strategyDecorrelated:
		// Bounded decorrelated jitter: U(base, min(cap, 3·prev)). Capping
		// the upper bound before the draw means no spike past the cap, and
		// saturating arithmetic means no overflow after many attempts.
		hi := min(p.capMs, satMul(max(prevDelayMs, p.baseMs), 3))
		if p.jitter == jitterNone {
			return hi
		}
		return p.baseMs + scale(hi-p.baseMs, r)
	}
	d = min(d, p.capMs)
	switch p.jitter {
	case jitterFull:
		return scale(d, r)
	case jitterEqual:
		half := d / 2
		return d - half + scale(half, r)
	case jitterProportional:
		spread := mulDiv(d, p.ratioPPM, 1_000_000)
		lo, hi := d-spread, min(p.capMs, d+spread)
		return lo + scale(hi-lo, r)
	}
	return d
}

// exponential returns min(cap, base × multiplier^n): by shifts when the
// multiplier is 2, else by fixed-point steps that stop at the cap.
func (p *Policy) exponential(n int64) int64 {
	d := p.baseMs
	if p.multMilli == 2000 {
		if n >= 63 || d > p.capMs>>n {
			return p.capMs
		}
		return min(d<<n, p.capMs)
	}
	if p.multMilli == 1000 {
		return min(d, p.capMs)
	}
	// Grow in thousandths of a millisecond, so a small base with a small
	// multiplier (1ms × 1.5) is not floored back to itself at every step.
	d, limit := satMul(d, 1000), satMul(p.capMs, 1000)
	for ; n > 0 && d < limit; n-- {
		d = mulDiv(d, p.multMilli, 1000)
	}
	return min(d/1000, p.capMs)
}

// cloudTasks returns the wait before retry n+1 as Cloud Tasks' RetryConfig
// schedules it: base doubled n times while n <= max_doublings, then growing
// by base × 2^max_doublings per retry, and capped. With base 10s, cap 300s
// and 3 doublings: 10s, 20s, 40s, 80s, 160s, 240s, 300s, 300s…
func (p *Policy) cloudTasks(n int64) int64 {
	step := p.exponential(min(n, p.maxDoublings)) // multiplier 2: shifts
	if n <= p.maxDoublings || step >= p.capMs {
		return step
	}
	// step × (1 + retries past the doublings), saturating.
	return min(satMul(step, n-p.maxDoublings+1), p.capMs)
}

// scale is the one place randomness enters a delay: floor(r × span), with
// r already clamped to [0, 1]. span is at most a policy duration in ms
// (under 2^44 < 2^53), so it converts to float64 exactly, and IEEE
// multiplication is the same on every platform.
func scale(span int64, r float64) int64 {
	if span <= 0 {
		return 0
	}
	return int64(r * float64(span))
}

// clampUnit maps any float64 into [0, 1]: NaN and negatives to 0, values
// of 1 and above (including +Inf) to 1.
func clampUnit(r float64) float64 {
	if !(r > 0) {
		return 0
	}
	if r > 1 {
		return 1
	}
	return r
}

// satAdd returns a+b for non-negative a and b, saturating at MaxInt64.
func satAdd(a, b int64) int64 {
	if s := a + b; s >= a {
		return s
	}
	return 1<<63 - 1
}

// satMul returns a×b for non-negative a and b, saturating at MaxInt64.
func satMul(a, b int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > 1<<63-1 {
		return 1<<63 - 1
	}
	return int64(lo)
}

// mulDiv returns a×b/c for non-negative a, b and positive c, saturating at
// MaxInt64, without intermediate overflow.
func mulDiv(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return 1<<63 - 1
	}
	q, _ := bits.Div64(hi, lo, uint64(c))
	if q > 1<<63-1 {
		return 1<<63 - 1
	}
	return int64(q)
}
