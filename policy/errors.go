package policy

import (
	"fmt"
	"strings"
)

// FieldError reports one invalid field of a policy file or of a Failure.
// Field is the dotted path of the field ("backoff.cap").
type FieldError struct {
	Field  string
	Line   int // 1-based line in the policy file, 0 when unknown
	Reason string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

// Error is returned by Parse when a policy file is invalid. It lists every
// problem found, in file order.
type Error struct {
	Problems []*FieldError
}

func (e *Error) Error() string {
	msgs := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		msgs[i] = p.Error()
	}
	return "invalid policy: " + strings.Join(msgs, "; ")
}

// InputError reports an invalid Failure field. Decide returns it instead of
// guessing a decision.
type InputError struct {
	Field  string
	Reason string
}

func (e *InputError) Error() string { return "invalid failure: " + e.Field + ": " + e.Reason }

func inputErrorf(field, format string, args ...any) error {
	return &InputError{Field: field, Reason: fmt.Sprintf(format, args...)}
}
