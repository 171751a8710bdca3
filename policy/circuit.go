package policy

// circuit is a breaker. A consecutive-failures one (the default) opens
// after threshold retryable failures in a row; a failure_rate one (rate
// set) when its sliding window's failure rate reaches its threshold. It
// stays open for openMs (failures then dead letter with circuit_open),
// then goes half-open: a failure re-opens it, needSuccesses successes
// close it.
//
// Callers that ask before each call (Policy.Acquire) get at most maxTrials
// trial calls admitted in half-open until they report back (a success
// through RecordSuccess, a failure through Decide). The trials of one
// round must report within openMs of the round's first admission; if one
// is still out then, it counts as failed: the breaker reopens at that
// instant, for openMs. Callers that never acquire are not limited, as
// before Acquire existed.
type circuit struct {
	threshold     int64
	openMs        int64
	needSuccesses int64
	maxTrials     int64
	rate          *rateWindow // failure_rate: the sliding window; nil: consecutive
	// slow is the slow-call window of a failure_rate breaker with
	// slow_call_rate_threshold (nil: none): the same size and
	// minimum_calls as rate, fed with each call's duration (RecordDuration),
	// a call counting as slow when it took longer than slowMs. Two windows
	// fed the same calls hold the same totals as Resilience4j's one window
	// with two counts; a call whose duration nobody measured is in neither
	// count of this one, so an unmeasured stream never opens it.
	slow   *rateWindow
	slowMs int64

	open       bool
	openUntil  int64
	failures   int64
	successes  int64
	inFlight   int64 // trials admitted in half-open and not reported yet
	roundStart int64 // when the first of those trials was admitted
}

func (c *circuit) state(nowMs int64) CircuitState {
	switch {
	case !c.open:
		return BreakerClosed
	case nowMs < c.openUntil:
		return BreakerOpen
	}
	return BreakerHalfOpen
}

// expire reopens the breaker when a half-open trial has not reported back
// within openMs: a hung probe must not keep the breaker half-open, and so
// refusing every call, forever.
func (c *circuit) expire(nowMs int64) {
	if c.inFlight > 0 {
		if deadline := satAdd(c.roundStart, c.openMs); nowMs >= deadline {
			c.trip(deadline)
		}
	}
}

// acquire answers whether a call may leave at nowMs, and counts a trial
// when it admits one in half-open.
func (c *circuit) acquire(nowMs int64) Permit {
	c.expire(nowMs)
	switch c.state(nowMs) {
	case BreakerClosed:
		return Permit{Allowed: true, State: BreakerClosed}
	case BreakerOpen:
		return Permit{RetryInMs: c.openUntil - nowMs, State: BreakerOpen}
	}
	if c.inFlight < c.maxTrials {
		if c.inFlight == 0 {
			c.roundStart = nowMs
		}
		c.inFlight++
		return Permit{Allowed: true, State: BreakerHalfOpen}
	}
	// Every trial slot is taken: the earliest change is the round's
	// time-out (a report back may come sooner).
	return Permit{RetryInMs: max(1, satAdd(c.roundStart, c.openMs)-nowMs), State: BreakerHalfOpen}
}

func (c *circuit) onFailure(nowMs int64) {
	c.expire(nowMs)
	switch c.state(nowMs) {
	case BreakerClosed:
		if c.rate != nil {
			if c.rate.record(nowMs, true) {
				c.trip(nowMs)
			}
			return
		}
		c.failures++
		if c.failures >= c.threshold {
			c.trip(nowMs)
		}
	case BreakerHalfOpen:
		c.trip(nowMs)
	}
}

func (c *circuit) onSuccess(nowMs int64) {
	c.expire(nowMs)
	switch c.state(nowMs) {
	case BreakerClosed:
		c.failures = 0
		// The rate is checked after every call, as Resilience4j does: the
		// call that brings the window to minimum_calls may be a success.
		if c.rate != nil && c.rate.record(nowMs, false) {
			c.trip(nowMs)
		}
	case BreakerHalfOpen:
		c.successes++
		if c.inFlight > 0 {
			c.inFlight--
		}
		if c.successes >= c.needSuccesses {
			*c = circuit{threshold: c.threshold, openMs: c.openMs, needSuccesses: c.needSuccesses, maxTrials: c.maxTrials,
				rate: c.rate, slow: c.slow, slowMs: c.slowMs}
			c.resetWindows()
		}
	}
}

// release gives back a half-open trial's slot without counting its
// outcome: the trial ended with a permanent error, so the dependency
// answered, but a rejected request proves neither health nor failure.
func (c *circuit) release(nowMs int64) {
	c.expire(nowMs)
	if c.inFlight > 0 && c.state(nowMs) == BreakerHalfOpen {
		c.inFlight--
	}
}

func (c *circuit) trip(atMs int64) {
	c.open = true
	c.openUntil = satAdd(atMs, c.openMs)
	c.failures = 0
	c.successes = 0
	c.inFlight = 0
	c.resetWindows()
}

// onDuration records how long a call that ended at nowMs took in the
// slow-call window, and opens the breaker when the window's share of slow
// calls reaches its threshold. Only a closed breaker counts: half-open
// decides on its trials' successes and failures, as with the failure rate.
func (c *circuit) onDuration(nowMs, durationMs int64) {
	if c.slow == nil {
		return
	}
	c.expire(nowMs)
	if c.state(nowMs) == BreakerClosed && c.slow.record(nowMs, durationMs > c.slowMs) {
		c.trip(nowMs)
	}
}

// resetWindows forgets the calls of both windows: they start afresh when
// the breaker changes state, as Resilience4j's does.
func (c *circuit) resetWindows() {
	if c.rate != nil {
		c.rate.reset()
	}
	if c.slow != nil {
		c.slow.reset()
	}
}
