package retry

import (
	"fmt"
	"time"

	"github.com/backstop-dev/backstop/policy"
)

// Error says why Do stopped retrying and keeps the last error.
//
// errors.As finds it; errors.Is and errors.As see through it to the last
// error (Err) and, when the context ended the loop, to the context's error.
type Error struct {
	// Reason is the policy's reason for stopping: max_attempts_reached,
	// permanent_error, not_idempotent, circuit_open (the breaker refused
	// the call before it was made), … The context's deadline or
	// cancellation gives max_elapsed_exceeded, with Context set.
	Reason policy.Reason
	// Attempts is the number of calls made.
	Attempts int64
	// Err is the last attempt's error (a *StatusError for a failed
	// *http.Response); nil when no call was made.
	Err error
	// StatusCode is the last response's HTTP status, 0 when none.
	StatusCode int
	// RetryIn is, for circuit_open, the time until the breaker half-opens.
	RetryIn time.Duration
	// Context is ctx.Err() when the context ended the loop.
	Context error
}

func (e *Error) Error() string {
	s := fmt.Sprintf("retry: stopped after %d attempts: %s", e.Attempts, e.Reason)
	if e.Context != nil {
		s += " (" + e.Context.Error() + ")"
	}
	if e.RetryIn > 0 {
		s += fmt.Sprintf(" (half-opens in %s)", e.RetryIn)
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// RetriedDownstream reports whether the loop decided its failure: a layer
// above gives it up too (retried_downstream) rather than retrying it
// again, retry at one layer (docs/layers.md). A circuit_open refusal, the
// breaker keeping a call from leaving, is not: it is classified by what it
// says, in every language.
func (e *Error) RetriedDownstream() bool {
	return e.Reason != policy.CircuitOpen
}

// Unwrap returns the last error and the context's error, those that are set.
func (e *Error) Unwrap() []error {
	var errs []error
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	if e.Context != nil {
		errs = append(errs, e.Context)
	}
	return errs
}
