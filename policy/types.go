package policy

import (
	"errors"
	"strconv"
)

// Failure describes one failed execution. Every field is a plain value, so a
// decision is a pure function of the Failure, the policy and its state.
//
// The zero value of each optional field means "not known": HTTPStatus 0,
// GRPCCode 0 (OK is never a failure), empty strings.
type Failure struct {
	// Attempt is the 1-based number of the execution that just failed: the
	// first execution is attempt 1.
	Attempt int64
	// HTTPStatus is the response status, 0 when there was no HTTP response.
	HTTPStatus int
	// GRPCCode is the gRPC status code (1..16), 0 when there was none.
	GRPCCode int
	// ErrorKind names a transport or application failure such as "timeout"
	// or "connection_refused" (see the error_kinds table).
	ErrorKind string
	// RetryAfter is the raw Retry-After header value: delta-seconds or an
	// HTTP-date.
	RetryAfter string
	// RetryPushback is the raw grpc-retry-pushback-ms metadata value.
	RetryPushback string
	// Method is the HTTP method of the request, empty when not HTTP.
	Method string
	// IdempotencyKey is the request's idempotency key, empty when none.
	IdempotencyKey string
	// ElapsedMs is the time since the first execution started.
	ElapsedMs int64
	// NowMs is the current Unix time in milliseconds; it is needed for
	// HTTP-date Retry-After values, the retry budget and the circuit breaker.
	NowMs int64
	// Random is a uniform draw from [0, 1) used for jitter. Values outside
	// that range (and NaN) are clamped into it.
	Random float64
	// PrevDelayMs is the previous delay, used by the decorrelated strategy.
	PrevDelayMs int64
	// RetriedDownstream is set when a layer below already retried this
	// failure and gave up (an inner retry loop's error, a Backstop-No-Retry
	// response header): retry at one layer, so it is given up
	// (retried_downstream) unless the policy's retried_downstream is retry.
	RetriedDownstream bool
	// ServerDeclined is set when the server asked not to be retried
	// (X-Envoy-Overloaded): given up (server_declined), as is a negative or
	// unparseable grpc-retry-pushback-ms (gRFC A6).
	ServerDeclined bool
}

// Action is what to do with the failed work.
type Action uint8

const (
	// Retry means schedule another attempt after Decision.DelayMs.
	Retry Action = iota
	// DeadLetter means stop retrying; Decision.Reason says why.
	DeadLetter
)

// Class is the retry class of a failure.
type Class uint8

const (
	// Retryable failures are transient and safe to retry.
	Retryable Class = iota
	// Permanent failures will fail again: never retried.
	Permanent
	// Uncertain failures may or may not have been applied (HTTP 500):
	// retried only up to the smaller uncertain limit.
	Uncertain
)

// Reason says why a decision was taken. Retry decisions carry Transient,
// RetryAfterHint or UncertainRetry; dead letters carry one of the others.
type Reason uint8

const (
	Transient Reason = iota
	RetryAfterHint
	UncertainRetry
	PermanentError
	MaxAttemptsReached
	MaxElapsedExceeded
	UncertainLimitReached
	NotIdempotent
	BudgetExhausted
	CircuitOpen
	RetryAfterTooLong
	RetriedDownstream
	ServerDeclined
	numReasons
)

var (
	actionNames = [...]string{Retry: "retry", DeadLetter: "dead_letter"}
	classNames  = [...]string{Retryable: "retryable", Permanent: "permanent", Uncertain: "uncertain"}
	reasonNames = [...]string{
		Transient:             "transient",
		RetryAfterHint:        "retry_after",
		UncertainRetry:        "uncertain",
		PermanentError:        "permanent_error",
		MaxAttemptsReached:    "max_attempts_reached",
		MaxElapsedExceeded:    "max_elapsed_exceeded",
		UncertainLimitReached: "uncertain_limit_reached",
		NotIdempotent:         "not_idempotent",
		BudgetExhausted:       "budget_exhausted",
		CircuitOpen:           "circuit_open",
		RetryAfterTooLong:     "retry_after_too_long",
		RetriedDownstream:     "retried_downstream",
		ServerDeclined:        "server_declined",
	}
)

func (a Action) String() string { return enumName(actionNames[:], int(a), "action") }
func (c Class) String() string  { return enumName(classNames[:], int(c), "class") }
func (r Reason) String() string {
	if r >= Success && r <= CrashLoop {
		return outcomeReasonNames[r-Success]
	}
	return enumName(reasonNames[:], int(r), "reason")
}

// outcomeReasonNames name the outcome-only reasons (Policy.Outcome), from
// Success on.
var outcomeReasonNames = [...]string{"success", "malformed", "crash_loop"}

// Reasons lists every decision reason name, retry reasons first (not the
// outcome-only Success, Malformed, CrashLoop).
func Reasons() []string { return append([]string(nil), reasonNames[:]...) }

func enumName(names []string, i int, what string) string {
	if i >= 0 && i < len(names) {
		return names[i]
	}
	return what + "(" + itoa(i) + ")"
}

func (a Action) MarshalText() ([]byte, error) { return []byte(a.String()), nil }
func (c Class) MarshalText() ([]byte, error)  { return []byte(c.String()), nil }
func (r Reason) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

func (a *Action) UnmarshalText(b []byte) error {
	return parseEnum(actionNames[:], b, "action", (*uint8)(a))
}
func (c *Class) UnmarshalText(b []byte) error {
	return parseEnum(classNames[:], b, "class", (*uint8)(c))
}
func (r *Reason) UnmarshalText(b []byte) error {
	for i, n := range outcomeReasonNames {
		if n == string(b) {
			*r = Success + Reason(i)
			return nil
		}
	}
	return parseEnum(reasonNames[:], b, "reason", (*uint8)(r))
}

func parseEnum(names []string, b []byte, what string, dst *uint8) error {
	for i, n := range names {
		if n == string(b) {
			*dst = uint8(i)
			return nil
		}
	}
	return errors.New("unknown " + what + " " + strconv.Quote(string(b)))
}

// Decision is the policy's answer for one Failure.
type Decision struct {
	Action  Action `json:"action"`
	DelayMs int64  `json:"delay_ms"`
	Reason  Reason `json:"reason"`
	Class   Class  `json:"class"`
}
