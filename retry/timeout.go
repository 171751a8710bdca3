package retry

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/backstop-dev/backstop"
)

// attemptContext returns the context of the attempt starting elapsed after
// the first: ctx with the policy's attempt timeout (0: none, ctx as it is).
func attemptContext(ctx context.Context, p backstop.Decider, elapsed time.Duration) (context.Context, context.CancelFunc, time.Duration, error) {
	ms, err := p.AttemptTimeout(ctx, max(elapsed.Milliseconds(), 0))
	if err != nil || ms == 0 {
		return ctx, func() {}, 0, err
	}
	timeout := time.Duration(ms) * time.Millisecond
	actx, cancel := context.WithTimeout(ctx, timeout)
	return actx, cancel, timeout, nil
}

// timedOut wraps the error of an attempt that ran out of its time as a
// timeout, whatever the operation made of its cancelled context.
func timedOut(attempt int64, timeout time.Duration, err error) error {
	return &backstop.Failure{ErrorKind: "timeout", Err: fmt.Errorf("retry: attempt %d timed out after %v: %w", attempt, timeout, err)}
}

// releaseAttempt ends an attempt's context once its result is done with: a
// response's body is read after Do returns (or drained before a retry), so
// closing the body releases it, as with http.Client.Timeout, whose time
// covers reading the body too. Anything else releases it at once.
func releaseAttempt(v any, cancel context.CancelFunc) {
	if r, ok := v.(*http.Response); ok && r != nil && r.Body != nil {
		r.Body = &cancelOnClose{ReadCloser: r.Body, cancel: cancel}
		return
	}
	cancel()
}

type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}
