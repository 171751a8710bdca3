package host

import (
	"errors"
	"strconv"
	"strings"

	"github.com/backstop-dev/backstop/policy"
)

// ErrClosed is returned when a Runtime or a Policy is used after Close.
var ErrClosed = errors.New("backstop: closed")

// ErrStateLost is returned, for good, by a stateful Policy (one with a
// retry budget or a circuit breaker) whose module instance trapped: that
// state lived in the instance and is gone. Load the policy again to start
// afresh. A trap retires only its own instance: stateless policies carry
// on in the others, or in a fresh one.
var ErrStateLost = errors.New("backstop: the policy's retry budget and circuit breaker were lost with the module instance that held them, which trapped; load the policy again")

// PolicyError reports policy bytes or a preset name the module refused.
// Load, LoadFile and Preset return it; check for it with errors.As.
type PolicyError struct {
	// Message is the module's message. It names each invalid field and the
	// reason, for example
	//
	//	invalid policy: backoff.cap: must be >= backoff.base (got 100ms < 1s)
	Message string
}

func (e *PolicyError) Error() string { return e.Message }

// InputError reports a policy.Failure the module refused (a field out of
// range, such as Attempt 0 or GRPCCode 99). No state changed for it.
//
// errors.As also fills a *policy.InputError from it, so code written against
// the native policy package handles both alike.
type InputError struct {
	// Index is the position of the failure in DecideBatch's failures, or -1
	// for Decide.
	Index int
	// Message is the module's message, naming the field, for example
	//
	//	invalid failure: attempt: must be >= 1 (got 0)
	Message string
}

func (e *InputError) Error() string {
	if e.Index < 0 {
		return e.Message
	}
	return "failures[" + strconv.Itoa(e.Index) + "]: " + e.Message
}

// As fills a *policy.InputError, or for Outcome's invalid event a
// *policy.EventError. The module's message is that error's own text,
// "invalid failure: <field>: <reason>" ("invalid event: …"), so nothing
// is lost.
func (e *InputError) As(target any) bool {
	switch t := target.(type) {
	case **policy.InputError:
		if field, reason, ok := e.cut("invalid failure: "); ok {
			*t = &policy.InputError{Field: field, Reason: reason}
			return true
		}
	case **policy.EventError:
		if field, reason, ok := e.cut("invalid event: "); ok {
			*t = &policy.EventError{Field: field, Reason: reason}
			return true
		}
	}
	return false
}

// cut splits the message after prefix into its field and reason.
func (e *InputError) cut(prefix string) (field, reason string, ok bool) {
	rest, ok := strings.CutPrefix(e.Message, prefix)
	if !ok {
		return "", "", false
	}
	return strings.Cut(rest, ": ")
}

// codeError is an error code other than the typed ones above: a bug or a
// limit, with the module's message.
type codeError struct {
	op   string
	code int64
	msg  string
}

func (e *codeError) Error() string {
	return "backstop.wasm: " + e.op + ": " + e.msg + " (code " + strconv.FormatInt(e.code, 10) + ")"
}
