package redisqueue

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/ctxtime"
	"github.com/backstop-dev/backstop/queue"
)

// Hold keeps entries pending to consumer from being reclaimed, without
// delivering them again: it resets their idle time (XCLAIM ... JUSTID), so
// Reclaim with a min idle time passes them by. It reports, per entry,
// whether consumer holds it; an entry pending to another consumer is left
// alone, and one no longer pending (its outcome was applied) is not held.
//
// # Notes
//
// Redis runs Hold when it refuses writes for lack of memory (maxmemory with
// noeviction), which is when a worker needs it: Ack, Retry and DeadLetter
// are refused then, and Work holds a job while it retries applying its
// outcome. At most 1000 entries per call.
func (q *Queue) Hold(ctx context.Context, consumer string, entryIDs ...string) ([]bool, error) {
	if len(entryIDs) == 0 {
		return nil, nil
	}
	if len(entryIDs) > 1000 {
		return nil, fmt.Errorf("queue %s: hold: at most 1000 entries per call, got %d", q.name, len(entryIDs))
	}
	args := make([]any, 0, 2+len(entryIDs))
	args = append(args, q.group, consumer)
	for _, id := range entryIDs {
		args = append(args, id)
	}
	v, err := scriptHold.Run(ctx, q.rdb, []string{q.keys.Jobs}, args...).Int64Slice()
	if err == nil && len(v) != len(entryIDs) {
		err = fmt.Errorf("%d replies for %d entries", len(v), len(entryIDs))
	}
	if err != nil {
		return nil, fmt.Errorf("queue %s: hold: %w", q.name, err)
	}
	held := make([]bool, len(v))
	for i, s := range v {
		held[i] = s == 1
	}
	return held, nil
}

// holdIDs are the entries a worker holds for job j: j's, then those of
// the jobs read with it and not started yet (at most Hold's 1000).
func holdIDs(j queue.Job, waiting []queue.Job) []string {
	ids := []string{j.EntryID}
	for _, wj := range waiting {
		ids = append(ids, wj.EntryID)
	}
	return ids[:min(len(ids), 1000)]
}

// applyOutcome makes one attempt at applying o to the entry. It reports
// false when the entry was no longer pending (another worker applied an
// outcome first).
func (q *Queue) applyOutcome(ctx context.Context, entryID string, o queue.Outcome) (bool, error) {
	switch o.Action {
	case queue.Ack:
		return q.Ack(ctx, entryID)
	case queue.Retry:
		_, applied, err := q.Retry(ctx, entryID, o.Delay, o.Reason, o.LastError)
		return applied, err
	case queue.Defer:
		_, applied, err := q.Defer(ctx, entryID, o.Delay, o.Reason, o.LastError)
		return applied, err
	default:
		id, err := q.DeadLetter(ctx, entryID, o.Reason, o.LastError)
		return id != "", err
	}
}

// writeRefused reports whether err says that Redis could not apply a write
// now but may soon, so that the same request is worth sending again:
//
//   - replies OOM (maxmemory reached with noeviction), READONLY (a replica,
//     during a failover), LOADING (a restart reading its data), BUSY (a
//     slow script), MASTERDOWN, MISCONF (writes refused after a failed
//     save), TRYAGAIN, CLUSTERDOWN, NOREPLICAS, and "ERR max number of
//     clients reached";
//   - no reply: a connection refused, reset or closed, a timeout, an
//     exhausted connection pool.
//
// Anything else is not retried: bad arguments (ERR backstop ...), a key of
// the wrong type (WRONGTYPE), missing permissions (NOPERM), a closed client,
// a cancelled context. Sending those again gives the same answer.
func writeRefused(err error) bool {
	var rerr redis.Error
	if errors.As(err, &rerr) {
		msg := rerr.Error()
		code, _, _ := strings.Cut(msg, " ")
		switch code {
		case "OOM", "READONLY", "LOADING", "BUSY", "MASTERDOWN", "MISCONF", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS":
			return true
		}
		return strings.HasPrefix(msg, "ERR max number of clients reached")
	}
	var ne net.Error
	switch {
	case errors.Is(err, redis.ErrClosed), errors.Is(err, context.Canceled):
		return false
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, redis.ErrPoolTimeout), errors.Is(err, redis.ErrPoolExhausted),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.As(err, &ne):
		return true
	}
	return false
}

// settle applies the outcome o of job j. While Redis refuses it (see
// writeRefused) the worker keeps the outcome and tries again, backing off
// (doubling from 20ms, capped at 2s and at a quarter of the min idle time,
// each pause jittered), and holds j and the jobs of its batch still
// waiting, so that reclaim does not hand them to another consumer: a job
// that ran is not run again because Redis was full. It stops when the
// outcome is applied, when the entry is no longer pending (another worker
// applied an outcome), or when the error is not a refusal. Once ctx is done
// it makes one last attempt, then logs that the outcome was not applied:
// the entry stays pending, for reclaim.
func (q *Queue) settle(ctx context.Context, w *worker, j queue.Job, o queue.Outcome, waiting []queue.Job) {
	ceiling := w.applyCap
	if w.minIdle > 0 {
		ceiling = min(ceiling, max(w.minIdle/4, time.Millisecond))
	}
	delay := min(w.applyBase, ceiling)
	ids := holdIDs(j, waiting)
	attrs := func(more ...any) []any {
		return append([]any{"queue", q.name, "entry", j.EntryID, "job", j.ID, "outcome", o.Action}, more...)
	}
	lostHold, holdFailed := false, false
	for refusals := 0; ; refusals++ {
		stopped := ctx.Err() != nil
		octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.outcomeWait)
		applied, err := q.applyOutcome(octx, j.EntryID, o)
		cancel()
		switch {
		case err == nil:
			if refusals > 0 {
				w.log.Info("queue outcome applied after refusals", attrs("applied", applied, "refusals", refusals)...)
			}
			if applied {
				w.runner.Applied(ctx, j, o)
			}
			return
		case !writeRefused(err):
			// Not worth sending again: the entry stays pending, and reclaim
			// delivers it again.
			w.log.Error("queue outcome not applied", attrs("err", err, "refusals", refusals)...)
			return
		case stopped:
			w.log.Error("queue outcome not applied: the worker stopped while Redis refused it; the entry stays pending",
				attrs("err", err, "refusals", refusals+1)...)
			return
		}
		total := w.refused.Add(1)
		if refusals == 0 {
			w.log.Warn("queue outcome refused, retrying", attrs("err", err, "refused_total", total)...)
		}
		hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.outcomeWait)
		held, herr := q.Hold(hctx, w.consumer, ids...)
		cancel()
		switch {
		case herr != nil && !holdFailed:
			// Holding is best effort (the next attempt tells): say so once.
			holdFailed = true
			w.log.Warn("queue entry not held while its outcome is refused", attrs("err", herr)...)
		case herr == nil && !held[0] && !lostHold:
			// Another consumer took the entry, or an outcome was applied:
			// the next attempt says which.
			lostHold = true
			w.log.Warn("queue entry no longer held by this worker", attrs()...)
		}
		ctxtime.Sleep(ctx, delay/2+time.Duration(rand.Int64N(int64(delay/2)+1)))
		delay = min(2*delay, ceiling)
	}
}
