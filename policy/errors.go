package policy

import "strings"

// FieldError reports one invalid field of a policy file or of a Failure.
// Field is the dotted path of the field ("backoff.cap").
type FieldError struct {
	Field  string
	Line   int // 1-based line in the policy file, 0 when unknown
	Reason string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

// Error is returned by Parse when a policy file is invalid. It lists the
// problems found, in file order: the first MaxProblems of them, with More
// counting the rest.
type Error struct {
	Problems []*FieldError
	More     int // problems found beyond those listed
}

// Error returns the problems on one line, separated by "; ", ending with
// "and N more problems" when some are not listed:
//
//	invalid policy: backoff.cap: must be >= backoff.base (got 100ms < 1s); and 3 more problems
func (e *Error) Error() string {
	msgs := make([]string, len(e.Problems), len(e.Problems)+1)
	for i, p := range e.Problems {
		msgs[i] = p.Error()
	}
	if e.More > 0 {
		msgs = append(msgs, e.moreText())
	}
	return "invalid policy: " + strings.Join(msgs, "; ")
}

// moreText says how many problems are not listed ("and 3 more problems"),
// "" when none.
func (e *Error) moreText() string {
	switch {
	case e.More == 1:
		return "and 1 more problem"
	case e.More > 1:
		return "and " + itoa(e.More) + " more problems"
	}
	return ""
}

// InputError reports an invalid Failure field. Decide returns it instead of
// guessing a decision.
type InputError struct {
	Field  string
	Reason string
}

func (e *InputError) Error() string { return "invalid failure: " + e.Field + ": " + e.Reason }

func inputError(field, reason string) error {
	return &InputError{Field: field, Reason: reason}
}
