// Package errkind classifies Go errors for the policy: the table from
// language errors to error kinds that every language follows
// (errorkinds.json beside this file; Node and Python copy it into their
// packages and test theirs against it). It lives apart from package queue
// so that package retry classifies errors without importing the queue
// (and go-redis); queue.ClassifyError and queue.Failure are this
// package's Classify and Failure.
package errkind

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"net"
	"syscall"

	"github.com/backstop-dev/backstop/policy"
)

// Failure wraps an error with what the policy needs to classify it: return
// one to say "the downstream answered 503 with Retry-After: 7". Errors
// without it are classified by Classify. Exported as queue.Failure and
// retry.Failure.
type Failure struct {
	Err        error
	HTTPStatus int
	GRPCCode   int
	ErrorKind  string
	RetryAfter string // raw Retry-After header value
	// RetriedDownstream says a layer below already retried this failure
	// and gave up (its response had Backstop-No-Retry): docs/layers.md.
	RetriedDownstream bool
	// ServerDeclined says the server asked not to be retried
	// (X-Envoy-Overloaded).
	ServerDeclined bool
}

func (f *Failure) Error() string {
	if f.Err != nil {
		return f.Err.Error()
	}
	return "failure"
}

func (f *Failure) Unwrap() error { return f.Err }

// gaveUp is what *retry.Error has (package retry imports this one, so
// not the other way round): true when an inner loop retried and stopped.
type gaveUp interface{ RetriedDownstream() bool }

// describer is an error that knows its failure's fields: retry's
// *StatusError, a failed response's status and headers.
type describer interface{ DescribeFailure(f *policy.Failure) }

// errorKinds is the one table from language errors to error kinds that
// every language follows (errorkinds.json; Node and Python test theirs
// against it): Go reads its errno codes from it.
//
//go:embed errorkinds.json
var errorKindsJSON []byte

// errnoKinds maps the table's codes that are errnos in Go to their kinds.
var errnoKinds = func() map[syscall.Errno]string {
	var t struct{ Codes map[string]string }
	if err := json.Unmarshal(errorKindsJSON, &t); err != nil {
		panic("errkind: errorkinds.json: " + err.Error())
	}
	m := map[syscall.Errno]string{}
	for name, kind := range t.Codes {
		if e, ok := errnoNames[name]; ok {
			m[e] = kind
		}
	}
	return m
}()

// errnoNames are the errnos Go has of the table's codes (the others are
// Node's and getaddrinfo's).
var errnoNames = map[string]syscall.Errno{
	"ECONNREFUSED": syscall.ECONNREFUSED, "ECONNRESET": syscall.ECONNRESET, "ECONNABORTED": syscall.ECONNABORTED,
	"EPIPE": syscall.EPIPE, "ETIMEDOUT": syscall.ETIMEDOUT,
}

// Classify fills the classification fields of a policy failure from an
// error: a *Failure anywhere in its chain, else by the table every language
// follows (errorkinds.json, in its "go" order): a dial that timed out
// (connect_timeout: the request never left), a deadline, an errno (refused,
// reset, timed out), a DNS failure, a network timeout. Other errors leave the
// fields empty, and the policy's default class applies.
//
// An error whose chain holds an inner retry loop's give-up (a
// *retry.Error that made a call) is marked RetriedDownstream: retry at one
// layer (docs/layers.md).
func Classify(err error, f *policy.Failure) {
	var gu gaveUp
	if errors.As(err, &gu) && gu.RetriedDownstream() {
		f.RetriedDownstream = true
	}
	var bf *Failure
	var desc describer
	var dns *net.DNSError
	var op *net.OpError
	var errno syscall.Errno
	var ne net.Error
	switch {
	case errors.As(err, &desc):
		desc.DescribeFailure(f)
	case errors.As(err, &bf):
		f.HTTPStatus, f.GRPCCode, f.ErrorKind, f.RetryAfter = bf.HTTPStatus, bf.GRPCCode, bf.ErrorKind, bf.RetryAfter
		f.RetriedDownstream = f.RetriedDownstream || bf.RetriedDownstream
		f.ServerDeclined = bf.ServerDeclined
	case errors.As(err, &op) && op.Op == "dial" && op.Timeout() && !errors.As(err, &dns):
		f.ErrorKind = "connect_timeout"
	case errors.Is(err, context.DeadlineExceeded):
		f.ErrorKind = "timeout"
	case errors.As(err, &errno) && errnoKinds[errno] != "":
		f.ErrorKind = errnoKinds[errno]
	case errors.As(err, &dns):
		f.ErrorKind = "dns_not_found"
		if dns.IsTemporary || dns.IsTimeout {
			f.ErrorKind = "dns_temporary"
		}
	case errors.As(err, &ne) && ne.Timeout():
		f.ErrorKind = "timeout"
	}
}
