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
func (s *Store) Once(ctx context.Context, scope, key, request string, fn func(context.Context) ([]byte, error)) ([]byte, error) {
	c, err := s.Begin(ctx, scope, key, request)
	if err != nil {
		return nil, err
	}
	m := s.o.metrics
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
	done := false
	defer func() {
		if !done { // fn panicked: a retry may run
			s.Fail(context.WithoutCancel(ctx), scope, key, c.Token)
		}
	}()
	out, err := fn(ctx)
	done = true
	if err != nil {
		if ferr := s.Fail(context.WithoutCancel(ctx), scope, key, c.Token); ferr != nil {
			return nil, errors.Join(err, ferr)
		}
		return nil, err
	}
	if err := s.Complete(context.WithoutCancel(ctx), scope, key, c.Token, Response{Status: 200, Body: out}); err != nil {
		return out, err
	}
	return out, nil
}
