package policy

// On-open behaviours of a queue (Policy.OnOpen).
const (
	// OnOpenDefer puts a job refused by an open breaker or an empty budget
	// back in the delayed set without spending an attempt.
	OnOpenDefer = "defer"
	// OnOpenDeadLetter dead-letters it (circuit_open, budget_exhausted).
	OnOpenDeadLetter = "dead_letter"
)

var onOpenNames = []string{OnOpenDefer, OnOpenDeadLetter}

// What a policy does with a failure a layer below already retried
// (Failure.RetriedDownstream; Policy.RetriedDownstream).
const (
	// DownstreamGiveUp gives it up: retried_downstream. Retry at one layer.
	DownstreamGiveUp = "give_up"
	// DownstreamRetry decides it as any other failure, for a layer whose
	// retries are on another time scale (a queue's cold retries after an
	// in-process loop's hot ones).
	DownstreamRetry = "retry"
)

var downstreamNames = []string{DownstreamGiveUp, DownstreamRetry}

// RetriedDownstream returns what the policy does with a failure a layer
// below already retried: DownstreamGiveUp (the default) or DownstreamRetry.
func (p *Policy) RetriedDownstream() string {
	if p.retryDownstream {
		return DownstreamRetry
	}
	return DownstreamGiveUp
}

// OnOpen returns what a queue does with a job refused by an open breaker or
// an empty budget: OnOpenDefer (the default) or OnOpenDeadLetter.
func (p *Policy) OnOpen() string { return p.onOpen }

// Acquire asks permission for one call at nowMs (Unix milliseconds), before
// the call is made. A policy without a circuit breaker always allows.
//
// While the breaker is open every call is refused, with RetryInMs until it
// half-opens. Half-open admits at most circuit_breaker.half_open_max_calls
// trial calls (default 1) until they report back: a trial's success
// (RecordSuccess) counts toward closing the breaker and frees its slot, its
// failure (Decide) reopens it. A trial that has not reported back within
// circuit_breaker.open_for of its round's first admission counts as failed:
// the breaker reopens at that instant.
//
// Acquire does not consult the retry budget: the budget limits retries,
// which Decide grants or refuses (budget_exhausted), as gRPC retry
// throttling does; first attempts are never throttled by it.
//
// # Notes
//
// Callers that never call Acquire keep Decide's behaviour: half-open then
// lets every call through. nowMs must be set on a stateful policy; with
// nowMs <= 0 Acquire refuses (RetryInMs 0) rather than judge on a clock it
// cannot read. The wasm hosts return an input error for it instead.
func (p *Policy) Acquire(nowMs int64) Permit {
	if p.circuit == nil {
		return Permit{Allowed: true, State: BreakerClosed}
	}
	if nowMs <= 0 {
		return Permit{State: p.CircuitState(max(nowMs, 0))}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.circuit.acquire(nowMs)
}
