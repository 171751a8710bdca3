package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrConflict: the key was used for a different request.
var ErrConflict = errors.New("idempotency: key used for a different request")

// ErrTooLarge: the first result was over the store's limit and was not kept;
// it cannot be replayed.
var ErrTooLarge = errors.New("idempotency: the first result was too large to store")

// InProgressError: another call holds the key; retry after RetryAfter.
type InProgressError struct {
	Key        string
	RetryAfter time.Duration
}

func (e *InProgressError) Error() string {
	return fmt.Sprintf("idempotency: key %q is in progress; retry after %v", e.Key, e.RetryAfter)
}

// Once runs fn at most once for key (within scope): a later call with the
// same key and request gets the first call's result without running fn.
// It is the worker's side of the store: with the job id as the key, a job
// redelivered after a crash returns its recorded result instead of running
// its side effect again.
//
//	res, err := store.Once(ctx, "charges", job.ID, job.ID, func(ctx context.Context) ([]byte, error) {
//		return charge(ctx, job)
//	})
//
// # Errors
//
// fn's error, after the key is released (a retry runs fn again);
// *InProgressError, ErrConflict or ErrTooLarge (errors.Is, errors.As); the
// store's errors, ErrLeaseLost among them when fn outlived its lease and
// another call took the key over (fn's result is then not stored).
//
// # Notes
//
// fn's result is stored (or the key released) even when ctx is done by
// then. A store call that fails is counted, logged and retried while the
// key's lease lasts. After fn's error, Once returns at once (with the first
// release's error joined, its retries go on in the background); after a
// result, it returns when the result is stored, when the lease ended (the
// store's last error: the key may run again), or when ctx is done (the first
// attempt's error; the retries go on).
func (s *Store) Once(ctx context.Context, scope, key, request string, fn func(context.Context) ([]byte, error)) ([]byte, error) {
	return Once(ctx, s, scope, key, request, fn)
}

// Once is Store.Once on any Backend: fn runs at most once for key (within
// scope); see Store.Once for the errors and notes.
func Once(ctx context.Context, s Backend, scope, key, request string, fn func(context.Context) ([]byte, error)) ([]byte, error) {
	start := time.Now() // the lease runs from about here on the server's clock
	c, err := s.Begin(ctx, scope, key, request)
	if err != nil {
		return nil, err
	}
	cfg := s.Config()
	m := cfg.Metrics
	switch c.State {
	case Conflict:
		m.requests.WithLabelValues("conflict").Inc()
		return nil, fmt.Errorf("%w: %q", ErrConflict, key)
	case InProgress:
		m.requests.WithLabelValues("in_progress").Inc()
		return nil, &InProgressError{Key: key, RetryAfter: c.RetryAfter}
	case Completed:
		if c.Response.TooLarge {
			m.requests.WithLabelValues("too_large").Inc()
			return nil, fmt.Errorf("%w: %q", ErrTooLarge, key)
		}
		m.requests.WithLabelValues("replayed").Inc()
		return c.Response.Body, nil
	}
	m.requests.WithLabelValues("first_run").Inc()
	// As the middleware: the record is completed or released whatever
	// happened to ctx (the worker's deadline), retried while the lease
	// lasts. Once waits for that unless ctx is done; the retries go on.
	until := start.Add(cfg.Lease)
	release := func(ctx context.Context) error { return s.Fail(ctx, scope, key, c.Token) }
	done := false
	defer func() {
		if !done { // fn panicked: a retry may run
			settle(cfg, ctx, "fail", key, until, release)
		}
	}()
	out, err := fn(ctx)
	done = true
	if err != nil {
		if ferr, _ := settle(cfg, ctx, "fail", key, until, release); ferr != nil { // retried in the background
			return nil, errors.Join(err, ferr)
		}
		return nil, err
	}
	return out, settled(ctx)(settle(cfg, ctx, "complete", key, until, func(ctx context.Context) error {
		return s.Complete(ctx, scope, key, c.Token, Response{Status: 200, Body: out})
	}))
}

// settled takes settle's answer and returns its outcome: the last error
// once its retries are over, or the first attempt's when ctx is done before
// (the retries go on).
func settled(ctx context.Context) func(first error, done <-chan error) error {
	return func(first error, done <-chan error) error {
		select {
		case err := <-done:
			return err
		case <-ctx.Done():
			return first
		}
	}
}
