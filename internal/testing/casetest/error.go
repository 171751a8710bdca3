package casetest

import (
	"context"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/retry"
)

// Error is a case's handle error (testdata/queue/README.md); each replay
// turns it into its broker's failure, or into Native's error when Native
// is set.
type Error struct {
	Message    string `json:"message"`
	HTTPStatus int    `json:"http_status,omitempty"`
	GRPCCode   int    `json:"grpc_code,omitempty"`
	ErrorKind  string `json:"error_kind,omitempty"`
	RetryAfter string `json:"retry_after,omitempty"`
	// Native is an error kind to raise as the language's own error of that
	// kind (classified by the table, errorkinds.json), with Message as text.
	Native string `json:"native,omitempty"`
	// Method is what a classifier may say of an HTTP request; a queue job
	// has none (docs/policy.md): every worker leaves it out of the failure
	// (Go's backstop.Failure has no method).
	Method string `json:"method,omitempty"`
	// InnerRetry is a reason: the handler returns the language's error of
	// an inner retry loop that stopped for it (docs/layers.md), over the
	// error the other fields make, with Message as text.
	InnerRetry string `json:"inner_retry,omitempty"`
}

// Handle returns the handler error of e: base (the broker's failure, or
// Native's error), wrapped as an inner retry.Do's give-up when InnerRetry
// is set; an unknown reason fails t.
func (e *Error) Handle(t testing.TB, base func() error) error {
	t.Helper()
	var err error
	if e.Native != "" {
		err = Native(t, e.Message, e.Native)
	} else {
		err = base()
	}
	if e.InnerRetry == "" {
		return err
	}
	var r policy.Reason
	if uerr := r.UnmarshalText([]byte(e.InnerRetry)); uerr != nil {
		t.Fatalf("inner_retry: %v", uerr)
	}
	attempts := int64(1)
	if r == policy.CircuitOpen { // the breaker refused: no call made
		attempts = 0
	}
	return &nativeErr{msg: e.Message, err: &retry.Error{Reason: r, Attempts: attempts, Err: err}}
}

// Native returns Go's own error of kind, as the standard library makes it,
// with msg as its text; an unknown kind fails t.
func Native(t testing.TB, msg, kind string) error {
	t.Helper()
	var err error
	switch kind {
	case "connection_refused":
		err = &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	case "connection_reset":
		err = &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	case "connect_timeout":
		err = &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}
	case "timeout":
		err = context.DeadlineExceeded
	case "dns_temporary":
		err = &net.DNSError{Err: "try again", Name: "example.com", IsTemporary: true}
	case "dns_not_found":
		err = &net.DNSError{Err: "no such host", Name: "example.invalid", IsNotFound: true}
	default:
		t.Fatalf("native error of kind %q: none made here", kind)
	}
	return &nativeErr{msg: msg, err: err}
}

// nativeErr is a language error of a kind with the case's text.
type nativeErr struct {
	msg string
	err error
}

func (e *nativeErr) Error() string { return e.msg }
func (e *nativeErr) Unwrap() error { return e.err }

// KindSpy is a policy that records the error kind of each failure it is
// asked the outcome of, then lets Decider decide (and answer every other question): how a
// test sees how a worker classified a failure.
type KindSpy struct {
	backstop.Decider
	mu    sync.Mutex
	kinds []string
}

func (s *KindSpy) Outcome(ctx context.Context, e policy.JobEvent) (policy.Outcome, error) {
	if e.Event == policy.EventFailure {
		s.mu.Lock()
		s.kinds = append(s.kinds, e.Failure.ErrorKind)
		s.mu.Unlock()
	}
	return s.Decider.Outcome(ctx, e)
}

// Kinds are the error kinds decided so far, in order.
func (s *KindSpy) Kinds() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.kinds...)
}
