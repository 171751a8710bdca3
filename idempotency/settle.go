package idempotency

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"
)

// settleAttempt bounds one store call made after a handler ran: its
// context no longer ends with the request's.
const settleAttempt = 5 * time.Second

// settle runs call, an owner's Complete or Fail after its handler ran, with
// a context that outlives ctx (a client that timed out, a worker's deadline)
// and ends with each attempt's own timeout. A failure other than
// ErrLeaseLost is retried in the background, 10ms doubling to at most 1s,
// jittered, while the owner's lease lasts (until): a store that is briefly
// down does not leave the key in progress until the lease frees it for a
// second run. Each failure is counted (store errors, by op); the first and
// how the retries ended are logged.
//
// first is the first attempt's error: the middleware answers its client
// then, without waiting for the retries. done yields the last error, nil
// once the call succeeded; the key may run again when it is not nil.
func settle(cfg Config, ctx context.Context, op, key string, until time.Time, call func(context.Context) error) (first error, done <-chan error) {
	log := cfg.Logger
	ctx = context.WithoutCancel(ctx)
	attempt := func(d time.Duration) error {
		actx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		return call(actx)
	}
	ch := make(chan error, 1)
	first = attempt(settleAttempt) // even past the lease: the owner completes when nobody took over
	if first == nil || errors.Is(first, ErrLeaseLost) {
		if first != nil {
			log.Warn("idempotency: store call refused: the lease was lost", "op", op, "key", key, "err", first)
		}
		ch <- first
		return first, ch
	}
	log.Warn("idempotency: store call failed after the handler ran; retrying while the lease lasts", "op", op, "key", key, "err", first)
	go func() {
		err, attempts := first, 1
		for delay := 10 * time.Millisecond; ; delay = min(2*delay, time.Second) {
			wait := delay/2 + rand.N(delay/2)
			left := time.Until(until) - wait
			if left <= 0 {
				break
			}
			time.Sleep(wait)
			err = attempt(min(settleAttempt, left))
			attempts++
			switch {
			case err == nil:
				log.Info("idempotency: store call succeeded after retries", "op", op, "key", key, "attempts", attempts)
				ch <- nil
				return
			case errors.Is(err, ErrLeaseLost):
				log.Warn("idempotency: store call refused: the lease was lost", "op", op, "key", key, "attempts", attempts, "err", err)
				ch <- err
				return
			}
		}
		log.Error("idempotency: store call still failing when the lease ended: the key may run again", "op", op, "key", key, "attempts", attempts, "err", err)
		ch <- err
	}()
	return first, ch
}
