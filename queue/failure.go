package queue

import (
	"context"
	"errors"
	"net"
	"syscall"

	"github.com/backstop-dev/backstop/policy"
)

// Failure wraps a handler error with what the policy needs to classify it:
// return one from a Handler to say "the downstream answered 503 with
// Retry-After: 7". Errors without it are classified by ClassifyError.
type Failure struct {
	Err        error
	HTTPStatus int
	GRPCCode   int
	ErrorKind  string
	RetryAfter string // raw Retry-After header value
}

func (f *Failure) Error() string {
	if f.Err != nil {
		return f.Err.Error()
	}
	return "failure"
}

func (f *Failure) Unwrap() error { return f.Err }

// ClassifyError fills the classification fields of a policy failure from an
// error: a *Failure anywhere in its chain, else a timeout, a refused or
// reset connection, or a temporary DNS failure. Other errors leave the
// fields empty, and the policy's default class applies.
func ClassifyError(err error, f *policy.Failure) {
	var bf *Failure
	var dns *net.DNSError
	var ne net.Error
	switch {
	case errors.As(err, &bf):
		f.HTTPStatus, f.GRPCCode, f.ErrorKind, f.RetryAfter = bf.HTTPStatus, bf.GRPCCode, bf.ErrorKind, bf.RetryAfter
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, syscall.ETIMEDOUT):
		f.ErrorKind = "timeout"
	case errors.Is(err, syscall.ECONNREFUSED):
		f.ErrorKind = "connection_refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		f.ErrorKind = "connection_reset"
	case errors.As(err, &dns):
		f.ErrorKind = "dns_not_found"
		if dns.IsTemporary || dns.IsTimeout {
			f.ErrorKind = "dns_temporary"
		}
	case errors.As(err, &ne) && ne.Timeout():
		f.ErrorKind = "timeout"
	}
}
