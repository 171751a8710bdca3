package redisqueue

import (
	"context"
	"fmt"
	"math"

	"github.com/backstop-dev/backstop/queue"
)

// The operator's DLQ workflow beyond Replay: discard (delete, purge) with a
// recorded reason, replay by job id, with the attempts kept, paced.

var scriptDiscard = mustScript("discard")

// AuditMaxLen is about how many discarded dead letters the audit stream
// keeps (XADD MAXLEN ~): the oldest records go first.
const AuditMaxLen = 10000

// AuditKey is the stream the queue's discarded dead letters are recorded in:
// {Q}:audit for the default keys (beside {Q}:dlq, so in its hash slot); for
// another layout the DLQ's key with its ":dlq" suffix replaced by ":audit"
// (or ":audit" appended).
func (q *Queue) AuditKey() string { return q.keys.Audit() }

// DiscardOptions selects the dead letters Discard removes and says why
// (queue.DiscardOptions: every broker's).
type DiscardOptions = queue.DiscardOptions

// Discard removes dead letters from the DLQ for good, each recorded first
// in the audit stream (AuditKey: fields action, note, actor, at_ms, then the
// dead letter's own) and counted in the stats field discarded, one atomic
// step per batch (queue/redisqueue/README.md, "The DLQ workflow"). It scans the whole
// DLQ in bounded calls (O(DLQ size) for a filtered discard) and returns how
// many went.
func (q *Queue) Discard(ctx context.Context, o DiscardOptions) (int, error) {
	fail := func(err error) error { return fmt.Errorf("queue %s: discard: %w", q.name, err) }
	if err := queue.CheckDiscard(o.Action, o.ID, o.Note, o.Actor, o.Limit); err != nil {
		return 0, fail(err)
	}
	if o.JobType != "" {
		if err := queue.ValidJobType(o.JobType); err != nil {
			return 0, fail(err)
		}
	}
	keys := []string{q.keys.DLQ, q.AuditKey(), q.keys.Stats}
	moved, cursor := 0, "-"
	for o.Limit == 0 || moved < o.Limit {
		batch := 1000
		if o.Limit > 0 {
			batch = min(o.Limit-moved, 1000)
		}
		n, next, done, err := batchReply(scriptDiscard.Run(ctx, q.rdb, keys, string(o.Action), o.Note, o.Actor,
			batch, cursor, batch*10, o.Reason, o.JobType, o.ID).Slice())
		if err != nil {
			return moved, fail(err)
		}
		moved, cursor = moved+n, next
		if done {
			break
		}
	}
	return moved, nil
}

// ReplayOptions selects the dead letters ReplayDeadLetters moves and how
// (queue.ReplayOptions: every broker's). With KeepAttempts, a dead letter
// whose attempt or first_enqueued_ms is not well-formed stays in the DLQ.
type ReplayOptions = queue.ReplayOptions

// ReplayDeadLetters is Replay with every option: by job id, with the
// attempts kept, paced. It returns how many moved, also with an error
// (the context's, when it ends while the replay waits for its next batch).
func (q *Queue) ReplayDeadLetters(ctx context.Context, o ReplayOptions) (int, error) {
	fail := func(err error) error { return fmt.Errorf("queue %s: replay: %w", q.name, err) }
	switch {
	case o.Limit < 0 || (o.Limit == 0 && o.ID == ""):
		return 0, fail(fmt.Errorf("limit must be at least 1 (or 0 with a job id: every one), got %d", o.Limit))
	case o.Rate < 0 || math.IsNaN(o.Rate) || math.IsInf(o.Rate, 0):
		return 0, fail(fmt.Errorf("rate must be a positive number of dead letters a second, got %v", o.Rate))
	}
	if err := queue.CheckActor(o.Actor); err != nil {
		return 0, fail(err)
	}
	if o.JobType != "" {
		if err := queue.ValidJobType(o.JobType); err != nil {
			return 0, fail(err)
		}
	}
	keep := "0"
	if o.KeepAttempts {
		keep = "1"
	}
	p := queue.NewPacer(o.Rate, 1000)
	defer p.Stop()
	keys := []string{q.keys.DLQ, q.keys.Jobs, q.keys.Stats}
	if o.Actor != "" { // each one recorded in the audit (replay.lua)
		keys = append(keys, q.AuditKey())
	}
	moved, cursor := 0, "-"
	for o.Limit == 0 || moved < o.Limit {
		batch := p.Batch()
		if o.Limit > 0 {
			batch = min(o.Limit-moved, batch)
		}
		if err := p.Wait(ctx); err != nil {
			return moved, fail(err)
		}
		n, next, done, err := batchReply(scriptReplay.Run(ctx, q.rdb, keys, batch, o.Reason, cursor, batch*10,
			o.JobType, keep, o.ID, o.Actor).Slice())
		if err != nil {
			return moved, fail(err)
		}
		moved, cursor = moved+n, next
		if done {
			break
		}
		if n == 0 {
			// A scan that moved nothing (a filter) spends no time of the
			// rate: the next batch goes at once.
			p.Skip()
		}
	}
	return moved, nil
}
