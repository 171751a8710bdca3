package policy

import "strconv"

// JobEvent is what a worker knows when it asks for a job's outcome.
type JobEvent struct {
	Event Event
	// Failure is, for EventFailure, the failure with the job's own facts
	// (Attempt, ElapsedMs, PrevDelayMs, IdempotencyKey = the job's id).
	// Its NowMs is the time of every event.
	Failure Failure
	// Deliveries is, for EventDelivered, the broker's delivery count
	// (RabbitMQ's x-delivery-count), and MaxDeliveries the worker's limit
	// (0: none).
	Deliveries, MaxDeliveries int64
}

// EventError reports an invalid JobEvent (not its failure: an invalid
// failure is an Outcome with Invalid set).
type EventError struct {
	Field  string
	Reason string
}

func (e *EventError) Error() string { return "invalid event: " + e.Field + ": " + e.Reason }

// Outcome decides what a worker does about a job event, so that every
// language's worker only runs the handler, asks, and applies the answer:
//
//   - EventDelivered: dead_letter crash_loop once Deliveries reaches
//     MaxDeliveries (when MaxDeliveries > 0); else run.
//   - EventBefore: the breaker's gate (Acquire). Allowed: run. Refused:
//     Pause for the time until it may half-open (OpenPollMs when it cannot
//     say), counted as refused; the job is deferred by as long with reason
//     circuit_open, or dead-lettered with on_open dead_letter.
//   - EventSuccess: RecordSuccess feeds the budget and the breaker: ack.
//   - EventFailure: Decide. A retry retries. circuit_open and
//     budget_exhausted defer the job with on_open defer (counted as
//     retries): circuit_open until the breaker may half-open (Acquire,
//     OpenPollMs when it allows or cannot say) with Pause, budget_exhausted
//     by the decision's backoff (OpenPollMs when 0). Anything else
//     dead-letters with the decision's reason.
//
// # Errors
//
// An *EventError, and no state changes, for an unknown Event, a negative
// Deliveries or MaxDeliveries (EventDelivered), or a NowMs that is
// negative, or 0 on a stateful policy (EventBefore, EventSuccess). An
// invalid failure (EventFailure) is not an error of the event: the
// Outcome dead-letters it (Malformed, Invalid set) and Decide's
// *InputError comes with it.
func (p *Policy) Outcome(e JobEvent) (Outcome, error) {
	now := e.Failure.NowMs
	switch e.Event {
	case EventDelivered:
		switch {
		case e.Deliveries < 0:
			return Outcome{}, &EventError{"deliveries", "must be >= 0 (got " + strconv.FormatInt(e.Deliveries, 10) + ")"}
		case e.MaxDeliveries < 0:
			return Outcome{}, &EventError{"max_deliveries", "must be >= 0 (got " + strconv.FormatInt(e.MaxDeliveries, 10) + ")"}
		case e.MaxDeliveries > 0 && e.Deliveries >= e.MaxDeliveries:
			return Outcome{Action: OutcomeDeadLetter, Reason: CrashLoop}, nil
		}
		return Outcome{Action: OutcomeRun}, nil
	case EventBefore, EventSuccess:
		if err := p.checkNow(now); err != nil {
			return Outcome{}, err
		}
		if e.Event == EventSuccess {
			p.RecordSuccess(now)
			return Outcome{Action: OutcomeAck, Reason: Success, Count: CountSuccess}, nil
		}
		pm := p.Acquire(now)
		if pm.Allowed {
			return Outcome{Action: OutcomeRun}, nil
		}
		// The breaker protects the dependency before the call: the job does
		// not run, and the worker takes none until it may half-open.
		o := Outcome{Action: OutcomeDefer, Reason: CircuitOpen, DelayMs: waitMs(pm.RetryInMs), Pause: true, Count: CountRefused}
		if p.onOpen == OnOpenDeadLetter {
			o.Action = OutcomeDeadLetter
		}
		return o, nil
	case EventFailure:
		return p.failureOutcome(&e.Failure)
	}
	return Outcome{}, &EventError{"event", "must be 0 (before) to 3 (delivered) (got " + strconv.Itoa(int(e.Event)) + ")"}
}

// failureOutcome decides a failed run.
func (p *Policy) failureOutcome(f *Failure) (Outcome, error) {
	d, err := p.Decide(*f)
	switch {
	case err != nil:
		return Outcome{Action: OutcomeDeadLetter, Reason: Malformed, Count: CountDeadLetter, Invalid: true}, err
	case d.Action == Retry:
		return Outcome{Action: OutcomeRetry, Reason: d.Reason, DelayMs: d.DelayMs, Count: CountRetry}, nil
	case p.onOpen == OnOpenDeadLetter || (d.Reason != CircuitOpen && d.Reason != BudgetExhausted):
		return Outcome{Action: OutcomeDeadLetter, Reason: d.Reason, Count: CountDeadLetter}, nil
	case d.Reason == BudgetExhausted:
		// Not the job's fault: it waits its backoff, which the decision
		// carries (0 only for a policy without one: poll rather than spin).
		return Outcome{Action: OutcomeDefer, Reason: d.Reason, DelayMs: waitMs(d.DelayMs), Count: CountRetry}, nil
	}
	// The failure found (or made) the breaker open: Acquire refuses and
	// says until when, without taking a trial slot.
	wait := int64(OpenPollMs)
	if pm := p.Acquire(f.NowMs); !pm.Allowed {
		wait = waitMs(pm.RetryInMs)
	}
	return Outcome{Action: OutcomeDefer, Reason: d.Reason, DelayMs: wait, Pause: true, Count: CountRetry}, nil
}

// waitMs is a wait the policy gave, or OpenPollMs when it gave none.
func waitMs(ms int64) int64 {
	if ms <= 0 {
		return OpenPollMs
	}
	return ms
}

// checkNow refuses a clock the breaker and the budget cannot run on, as
// Decide does for a failure.
func (p *Policy) checkNow(now int64) error {
	switch {
	case now < 0:
		return &EventError{"now_ms", "must be >= 0 (got " + strconv.FormatInt(now, 10) + ")"}
	case now == 0 && p.stateful:
		return &EventError{"now_ms", "must be set (Unix milliseconds) for a policy with a retry budget or a circuit breaker"}
	}
	return nil
}
