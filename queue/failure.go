package queue

import (
	"github.com/backstop-dev/backstop/internal/errkind"
	"github.com/backstop-dev/backstop/policy"
)

// Failure wraps a handler error with what the policy needs to classify it:
// return one from a Handler to say "the downstream answered 503 with
// Retry-After: 7". Errors without it are classified by ClassifyError.
//
//	return &queue.Failure{HTTPStatus: 503, RetryAfter: "7", Err: err}
//
// Its fields are Err (the error), HTTPStatus, GRPCCode, ErrorKind and
// RetryAfter (the raw Retry-After header value). It is the same type as
// retry.Failure.
type Failure = errkind.Failure

// ClassifyError fills the classification fields of a policy failure from an
// error: a *Failure anywhere in its chain, else by the table every language
// follows (internal/errkind/errorkinds.json, in its "go" order): a dial
// that timed out (connect_timeout: the request never left), a deadline, an
// errno (refused, reset, timed out), a DNS failure, a network timeout.
// Other errors leave the fields empty, and the policy's default class
// applies.
func ClassifyError(err error, f *policy.Failure) { errkind.Classify(err, f) }
