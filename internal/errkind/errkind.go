// Package errkind classifies Go errors for the policy: the table from
// language errors to error kinds that every language follows
// (contract/errorkinds.json; Node and Python copy it into their
// packages and test theirs against it). It lives apart from package queue
// so that package retry classifies errors without importing the queue
// (and go-redis); backstop.ClassifyError (the module's root package) is
// this package's Classify.
package errkind

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"syscall"

	"github.com/backstop-dev/backstop/contract"
	"github.com/backstop-dev/backstop/policy"
)

// gaveUp is what *retry.Error has (package retry imports this one, so
// not the other way round): true when an inner loop retried and stopped.
type gaveUp interface{ RetriedDownstream() bool }

// describer is an error that knows its failure's fields: retry's
// *StatusError, a failed response's status and headers.
type describer interface{ DescribeFailure(f *policy.Failure) }

// errorKinds is the one table from language errors to error kinds that
// every language follows (contract/errorkinds.json; Node and Python test
// theirs against it): Go reads its errno codes from it.
var errorKindsJSON = contract.ErrorKinds

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
	if gu, ok := first[gaveUp](err); ok && gu.RetriedDownstream() {
		f.RetriedDownstream = true
	}
	if desc, ok := first[describer](err); ok {
		// Through a copy: f passed to an interface method would escape, and
		// every caller's Failure with it (an allocation per attempt).
		g := new(policy.Failure)
		*g = *f
		desc.DescribeFailure(g)
		*f = *g
		return
	}
	if bf, ok := first[*policy.Failure](err); ok {
		copyErrorFields(f, bf)
		return
	}
	if k := kindOf(err); k != "" {
		f.ErrorKind = k
	}
}

// kindOf is the table's kind of a language error ("": none).
func kindOf(err error) string {
	var dns *net.DNSError
	var op *net.OpError
	var errno syscall.Errno
	var ne net.Error
	switch {
	case errors.As(err, &op) && op.Op == "dial" && op.Timeout() && !errors.As(err, &dns):
		return "connect_timeout"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.As(err, &errno) && errnoKinds[errno] != "":
		return errnoKinds[errno]
	case errors.As(err, &dns):
		if dns.IsTemporary || dns.IsTimeout {
			return "dns_temporary"
		}
		return "dns_not_found"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	}
	return ""
}

// first returns the first error of type T in err's tree, depth first as
// errors.As walks it, without errors.As's allocation of a target per call
// (Classify runs once per attempt). It ignores As methods: no other error
// stands in for backstop's own types.
func first[T any](err error) (T, bool) {
	var zero T
	for err != nil {
		if t, ok := err.(T); ok {
			return t, true
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if t, ok := first[T](e); ok {
					return t, true
				}
			}
			return zero, false
		default:
			return zero, false
		}
	}
	return zero, false
}
