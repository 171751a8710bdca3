// Package retry runs a function under a backstop policy: the Go retry loop
// beside Node's retry() and Python's @policy.retry.
//
//	p, _ := policy.Preset("default")
//	resp, err := retry.Do(ctx, backstop.Native(p), func(ctx context.Context) (*http.Response, error) {
//		return http.DefaultClient.Do(req.WithContext(ctx))
//	}, retry.WithRequest(req))
//
// Do asks the policy's breaker before each attempt, classifies what the
// function returned (Go errors by the table every language follows,
// contract/errorkinds.json, or a *backstop.Failure that says; failed
// *http.Response values by status,
// Retry-After, method and Idempotency-Key), sleeps the delay the policy
// decides, and stops with an *Error that says why and keeps the last error.
package retry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/internal/clientmetrics"
	"github.com/backstop-dev/backstop/internal/errkind"
	"github.com/backstop-dev/backstop/policy"
)

// Operation is one attempt. Its context is Do's, with the attempt's
// deadline when the policy bounds attempts (attempt_timeout, max_elapsed):
// an Operation must honour it, as http.Client and gRPC do.
type Operation[T any] func(ctx context.Context) (T, error)

// Do runs op until it succeeds or p says stop, and returns op's last result.
//
// An attempt fails when op returns an error, or a *http.Response with a
// status of 400 or more (its body is drained and closed before a retry).
// The context's deadline is an elapsed limit: a retry that would be due
// after it is not scheduled. On a policy with a circuit breaker, each
// attempt first asks p.Acquire: a refused call is not made, and Do stops
// with circuit_open and the time until the breaker may admit one
// (Error.RetryIn). A success is reported with p.RecordSuccess.
//
// Each attempt runs under the policy's attempt timeout (attempt_timeout,
// cut to what is left of max_elapsed): its context is cancelled when the
// time runs out, and the attempt's error counts as a timeout (error kind
// "timeout"), decided as any. The time covers reading a returned
// response's body, as http.Client.Timeout's does; closing the body ends it.
//
// # Errors
//
// When retrying stops, Do returns an *Error with the reason and the last
// error (errors.As and errors.Is see both). When the last attempt returned a
// failed *http.Response, Do returns it too: the caller closes its body. An
// invalid option (a metrics label that is not valid UTF-8, a registry that
// holds other collectors under the same names) is returned before the first
// attempt.
func Do[T any](ctx context.Context, p backstop.Decider, op Operation[T], opts ...Option) (T, error) {
	var zero T
	c := defaults
	for _, o := range opts {
		o(&c)
	}
	if p == nil {
		return zero, errors.New("retry: policy: must not be nil")
	}
	m, err := c.recorder()
	if err != nil {
		return zero, err
	}
	stateful := p.Stateful()
	start := c.clock.Now()
	var prevDelayMs int64
	var lastErr error
	var failedAt time.Time // the last failure's, when a retry follows it
	var kept [2]bool       // attempt headers the caller set itself
	headers := c.req != nil && !c.noHeaders
	if headers {
		kept = callerSet(c.req.Header)
		// Removed once Do returns, so that a request sent again by another
		// Do is not taken for one whose caller set them (as in Node, Python).
		defer clearAttemptHeaders(c.req.Header, kept)
	}
	for attempt := int64(1); ; attempt++ {
		if err := ctx.Err(); err != nil {
			return zero, &Error{Reason: policy.MaxElapsedExceeded, Attempts: attempt - 1, Context: err, Err: lastErr}
		}
		now := c.clock.Now()
		if stateful {
			permit, err := p.Acquire(ctx, now.UnixMilli())
			if err != nil {
				return zero, fmt.Errorf("retry: acquire: %w", err)
			}
			m.State(permit.State)
			if !permit.Allowed {
				m.Refused(policy.CircuitOpen.String())
				recordGaveUp(ctx, policy.CircuitOpen)
				return zero, &Error{Reason: policy.CircuitOpen, Attempts: attempt - 1, RetryIn: time.Duration(permit.RetryInMs) * time.Millisecond}
			}
		}
		if !failedAt.IsZero() {
			// The measured latency of this retry: its delay plus however
			// late the sleep returned (the decided delay is in Retry).
			m.Latency(now.Sub(failedAt))
		}
		if headers {
			setAttemptHeaders(c.req.Header, attempt, kept)
		}
		actx, release, timeout, err := attemptContext(ctx, p, now.Sub(start))
		if err != nil {
			return zero, fmt.Errorf("retry: attempt timeout: %w", err)
		}
		called := c.clock.Now()
		v, opErr := op(context.WithValue(actx, attemptKey{}, attempt))
		if opErr != nil && timeout > 0 && actx.Err() != nil && ctx.Err() == nil {
			opErr = timedOut(attempt, timeout, opErr)
		}
		releaseAttempt(v, release)
		if stateful && ctx.Err() == nil {
			// The call's duration (monotonic) for the breaker's slow-call
			// rate, success or failure; the caller's cancellation is no call.
			end := c.clock.Now()
			if err := p.RecordDuration(ctx, end.UnixMilli(), max(end.Sub(called).Milliseconds(), 0)); err != nil {
				return v, fmt.Errorf("retry: record duration: %w", err)
			}
		}
		resp, failedResp := failedResponse(v)
		if opErr == nil && !failedResp {
			m.Attempt(clientmetrics.OutcomeSuccess)
			if stateful {
				now := c.clock.Now().UnixMilli()
				if err := p.RecordSuccess(ctx, now); err != nil {
					return v, fmt.Errorf("retry: record success: %w", err)
				}
				stateAt(ctx, m, p, now)
			}
			return v, nil
		}
		if ctx.Err() != nil && opErr != nil && errors.Is(opErr, ctx.Err()) {
			// The caller's cancellation is never a failure to retry.
			m.Attempt(clientmetrics.OutcomeDeadLetter)
			return v, &Error{Reason: policy.MaxElapsedExceeded, Attempts: attempt, Err: opErr, Context: ctx.Err()}
		}
		now = c.clock.Now()
		f := policy.Failure{
			Attempt:     attempt,
			ElapsedMs:   max(now.Sub(start).Milliseconds(), 0),
			NowMs:       now.UnixMilli(),
			PrevDelayMs: prevDelayMs,
			Random:      c.random(),
		}
		if opErr == nil {
			opErr = describeResponse(resp, &f)
		} else {
			// An error says more than the response beside it: a nested Do
			// returns its last response and the *Error of its give-up.
			errkind.Classify(opErr, &f)
		}
		c.request(&f)
		d, err := p.Decide(ctx, f)
		if err != nil {
			m.Attempt(clientmetrics.OutcomeDeadLetter)
			return v, fmt.Errorf("retry: decide attempt %d: %w", attempt, err)
		}
		if stateful {
			stateAt(ctx, m, p, f.NowMs)
		}
		delay := time.Duration(d.DelayMs) * time.Millisecond
		if d.Action == policy.Retry {
			if dl, ok := ctx.Deadline(); ok && now.Add(delay).After(dl) {
				// Stop before the deadline, not after it.
				d = policy.Decision{Action: policy.DeadLetter, Reason: policy.MaxElapsedExceeded, Class: d.Class}
			}
		}
		if d.Action != policy.Retry {
			m.Attempt(clientmetrics.OutcomeDeadLetter)
			recordGaveUp(ctx, d.Reason)
			return v, &Error{Reason: d.Reason, Attempts: attempt, Err: opErr, StatusCode: f.HTTPStatus}
		}
		lastErr = opErr
		failedAt = now
		m.Attempt(clientmetrics.OutcomeRetry)
		m.Retry(d.Reason.String(), delay)
		if failedResp {
			// Free the connection of a response nobody will read.
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
		}
		if err := c.clock.Sleep(ctx, delay); err != nil {
			return zero, &Error{Reason: policy.MaxElapsedExceeded, Attempts: attempt, Err: opErr, Context: err}
		}
		prevDelayMs = d.DelayMs
	}
}

// failedResponse reports whether v is a *http.Response with a failure status.
func failedResponse(v any) (*http.Response, bool) {
	r, ok := v.(*http.Response)
	return r, ok && r != nil && r.StatusCode >= 400
}

// describeResponse fills f from a failed response and returns the error
// that stands for it.
func describeResponse(r *http.Response, f *policy.Failure) error {
	e := &StatusError{StatusCode: r.StatusCode, RetryAfter: r.Header.Get("Retry-After"),
		RetriedDownstream: r.Header.Get(HeaderNoRetry) != "", ServerDeclined: r.Header.Get(HeaderOverloaded) != ""}
	e.DescribeFailure(f)
	if req := r.Request; req != nil {
		f.Method = req.Method
		f.IdempotencyKey = req.Header.Get("Idempotency-Key")
	}
	return e
}

// StatusError stands for a failed *http.Response in an *Error.
type StatusError struct {
	StatusCode int
	// RetryAfter is the response's Retry-After header.
	RetryAfter string
	// RetriedDownstream: the response had Backstop-No-Retry (a layer below
	// gave up); ServerDeclined: it had X-Envoy-Overloaded.
	RetriedDownstream, ServerDeclined bool
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("http status %d %s", e.StatusCode, http.StatusText(e.StatusCode))
}

// DescribeFailure fills the fields of f the response gave, so that a queue
// worker classifies an *Error of Do the way Do classified its last attempt.
func (e *StatusError) DescribeFailure(f *policy.Failure) {
	f.HTTPStatus, f.RetryAfter = e.StatusCode, e.RetryAfter
	f.RetriedDownstream = f.RetriedDownstream || e.RetriedDownstream
	f.ServerDeclined = e.ServerDeclined
}
