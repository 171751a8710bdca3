package policy

import "strconv"

// Event is what happened to a job that a worker asks the outcome of.
type Event uint8

const (
	// EventBefore: the job is about to run: the breaker's gate (Acquire).
	EventBefore Event = iota
	// EventSuccess: the job ran and succeeded.
	EventSuccess
	// EventFailure: the job ran and failed; JobEvent.Failure says how.
	EventFailure
	// EventDelivered: a broker delivered the job Deliveries times without
	// an outcome (a worker that crashed or was cut off mid-job).
	EventDelivered
	numEvents
)

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

// OutcomeAction is what a worker does with a job.
type OutcomeAction uint8

const (
	// OutcomeRun: run the job's handler.
	OutcomeRun OutcomeAction = iota
	// OutcomeAck: the job succeeded.
	OutcomeAck
	// OutcomeRetry: the job failed and waits DelayMs before its next attempt.
	OutcomeRetry
	// OutcomeDefer: the breaker or the budget refused the job; it waits
	// DelayMs without spending an attempt (not the job's fault).
	OutcomeDefer
	// OutcomeDeadLetter: the job goes to the dead letter queue.
	OutcomeDeadLetter
	numOutcomeActions
)

// Count is the client metric a worker records for an outcome
// (backstop_client_*).
type Count uint8

const (
	// CountNone: nothing to count (the job runs, or a crash loop the
	// broker's counters already see).
	CountNone Count = iota
	// CountSuccess: attempts_total{outcome="success"}.
	CountSuccess
	// CountRetry: attempts_total{outcome="retry"}, and retries_total{reason}
	// with the delay.
	CountRetry
	// CountDeadLetter: attempts_total{outcome="dead_letter"}.
	CountDeadLetter
	// CountRefused: calls_refused_total{reason}: the breaker refused the
	// job before it ran.
	CountRefused
	numCounts
)

// Outcome-only reasons: an Outcome's Reason is a decision's, or one of
// these. Codes 13 to 15 are kept for decision reasons to come.
const (
	// Success: the job succeeded (an ack).
	Success Reason = 16 + iota
	// Malformed: the job (or its failure) could not be decided.
	Malformed
	// CrashLoop: the broker delivered the job MaxDeliveries times without
	// an outcome.
	CrashLoop
)

// OpenPollMs is how long a job refused by the breaker waits, and the
// worker pauses, when the policy cannot say how long: Acquire gave no
// time, or let a call through after the failure found the breaker open.
// A budget_exhausted deferral without a backoff waits as long.
const OpenPollMs = 1000

var (
	eventNames         = [...]string{"before", "success", "failure", "delivered"}
	outcomeActionNames = [...]string{"run", "ack", "retry", "defer", "dead_letter"}
	countNames         = [...]string{"none", "success", "retry", "dead_letter", "refused"}
)

func (e Event) String() string { return enumName(eventNames[:], int(e), "event") }
func (a OutcomeAction) String() string {
	return enumName(outcomeActionNames[:], int(a), "outcome_action")
}
func (c Count) String() string { return enumName(countNames[:], int(c), "count") }

func (e Event) MarshalText() ([]byte, error)         { return []byte(e.String()), nil }
func (a OutcomeAction) MarshalText() ([]byte, error) { return []byte(a.String()), nil }
func (c Count) MarshalText() ([]byte, error)         { return []byte(c.String()), nil }

func (e *Event) UnmarshalText(b []byte) error {
	return parseEnum(eventNames[:], b, "event", (*uint8)(e))
}
func (a *OutcomeAction) UnmarshalText(b []byte) error {
	return parseEnum(outcomeActionNames[:], b, "outcome action", (*uint8)(a))
}
func (c *Count) UnmarshalText(b []byte) error {
	return parseEnum(countNames[:], b, "count", (*uint8)(c))
}

// Outcome is what a worker does about a job event: the policy's answer to
// Policy.Outcome, the same in every language.
type Outcome struct {
	Action OutcomeAction `json:"action"`
	// Reason is a decision's reason, or Success, Malformed, CrashLoop;
	// 0 (meaningless) for OutcomeRun.
	Reason Reason `json:"reason"`
	// DelayMs is how long a retried or deferred job waits, and how long a
	// paused worker takes no job.
	DelayMs int64 `json:"delay_ms"`
	// Pause is set when the breaker refused: the worker takes no job of
	// this policy for DelayMs.
	Pause bool `json:"pause"`
	// Count is the client metric the worker records.
	Count Count `json:"count"`
	// Invalid is set when the policy refused the failure as invalid input:
	// the job is dead-lettered as malformed, and the error says why.
	Invalid bool `json:"invalid"`
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
