package policy

// CircuitState is the state of a policy's circuit breaker.
type CircuitState uint8

const (
	BreakerClosed CircuitState = iota
	BreakerOpen
	BreakerHalfOpen
)

func (s CircuitState) String() string {
	return enumName([]string{"closed", "open", "half_open"}, int(s), "circuit_state")
}

// circuit is a consecutive-failures breaker. It opens after threshold
// retryable failures in a row, stays open for openMs (failures then dead
// letter with circuit_open), then lets calls through half-open: a failure
// re-opens it, needSuccesses successes close it.
type circuit struct {
	threshold     int64
	openMs        int64
	needSuccesses int64

	open      bool
	openUntil int64
	failures  int64
	successes int64
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

func (c *circuit) onFailure(nowMs int64) {
	switch c.state(nowMs) {
	case BreakerClosed:
		c.failures++
		if c.failures >= c.threshold {
			c.trip(nowMs)
		}
	case BreakerHalfOpen:
		c.trip(nowMs)
	}
}

func (c *circuit) onSuccess(nowMs int64) {
	switch c.state(nowMs) {
	case BreakerClosed:
		c.failures = 0
	case BreakerHalfOpen:
		c.successes++
		if c.successes >= c.needSuccesses {
			*c = circuit{threshold: c.threshold, openMs: c.openMs, needSuccesses: c.needSuccesses}
		}
	}
}

func (c *circuit) trip(nowMs int64) {
	c.open = true
	c.openUntil = satAdd(nowMs, c.openMs)
	c.failures = 0
	c.successes = 0
}
