package queue

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// The operator's DLQ workflow beyond Replay: discard (delete, purge) with a
// recorded reason, replay by job id, with the attempts kept, paced.

var scriptDiscard = mustScript("discard")

// AuditMaxLen is about how many discarded dead letters the audit stream
// keeps (XADD MAXLEN ~): the oldest records go first.
const AuditMaxLen = 10000

// MaxNoteLen and MaxActorLen bound a discard's note (why) and actor (who).
const (
	MaxNoteLen  = 1024
	MaxActorLen = 256
)

// AuditKey is the stream the queue's discarded dead letters are recorded in:
// {Q}:audit for the default keys (beside {Q}:dlq, so in its hash slot); for
// another layout the DLQ's key with its ":dlq" suffix replaced by ":audit"
// (or ":audit" appended).
func (q *Queue) AuditKey() string {
	if base, ok := strings.CutSuffix(q.keys.DLQ, ":dlq"); ok {
		return base + ":audit"
	}
	return q.keys.DLQ + ":audit"
}

// DiscardAction names what an operator did: delete (one job's dead letters)
// or purge (every dead letter that matches).
type DiscardAction string

const (
	DiscardDelete DiscardAction = "delete"
	DiscardPurge  DiscardAction = "purge"
)

// DiscardOptions selects the dead letters Discard removes and says why.
type DiscardOptions struct {
	// Action is DiscardDelete (ID required) or DiscardPurge.
	Action DiscardAction
	// ID discards only the dead letters of this job id ("" = any; required
	// for DiscardDelete).
	ID string
	// Reason discards only dead letters with this reason ("" = any).
	Reason string
	// JobType discards only dead letters of this job type ("" = any).
	JobType string
	// Limit is the most dead letters discarded; 0 = every one that matches.
	Limit int
	// Note is why (1..1024 bytes, required): recorded with each one.
	Note string
	// Actor is who (1..256 bytes, required), e.g. user@host.
	Actor string
}

// Discard removes dead letters from the DLQ for good, each recorded first
// in the audit stream (AuditKey: fields action, note, actor, at_ms, then the
// dead letter's own) and counted in the stats field discarded, one atomic
// step per batch (queue/README.md, "The DLQ workflow"). It scans the whole
// DLQ in bounded calls (O(DLQ size) for a filtered discard) and returns how
// many went.
func (q *Queue) Discard(ctx context.Context, o DiscardOptions) (int, error) {
	fail := func(err error) error { return fmt.Errorf("queue %s: discard: %w", q.name, err) }
	switch {
	case o.Action != DiscardDelete && o.Action != DiscardPurge:
		return 0, fail(fmt.Errorf("action must be %q or %q, got %q", DiscardDelete, DiscardPurge, o.Action))
	case o.Action == DiscardDelete && o.ID == "":
		return 0, fail(fmt.Errorf("delete needs a job id"))
	case len(o.Note) < 1 || len(o.Note) > MaxNoteLen:
		return 0, fail(fmt.Errorf("the note (why) must be 1..%d bytes, got %d", MaxNoteLen, len(o.Note)))
	case len(o.Actor) < 1 || len(o.Actor) > MaxActorLen:
		return 0, fail(fmt.Errorf("the actor (who) must be 1..%d bytes, got %d", MaxActorLen, len(o.Actor)))
	case o.Limit < 0:
		return 0, fail(fmt.Errorf("limit must be >= 0 (0: every one), got %d", o.Limit))
	}
	if o.JobType != "" {
		if err := ValidJobType(o.JobType); err != nil {
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

// ReplayOptions selects the dead letters ReplayDeadLetters moves and how.
type ReplayOptions struct {
	// Limit is the most dead letters moved: required (at least 1) unless ID
	// is given; 0 with an ID = every dead letter of that job.
	Limit int
	// Reason, JobType and ID move only the dead letters with this reason,
	// of this job type, of this job id ("" = any).
	Reason, JobType, ID string
	// KeepAttempts keeps each dead letter's attempt and first_enqueued_ms
	// (the time budget) instead of starting the job afresh. A dead letter
	// whose attempt or first_enqueued_ms is not well-formed stays then in
	// the DLQ.
	KeepAttempts bool
	// Rate paces the replay: at most Rate dead letters a second on average,
	// in batches (Pacer); 0 = as fast as Redis takes them.
	Rate float64
}

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
	if o.JobType != "" {
		if err := ValidJobType(o.JobType); err != nil {
			return 0, fail(err)
		}
	}
	keep := "0"
	if o.KeepAttempts {
		keep = "1"
	}
	p := NewPacer(o.Rate, 1000)
	defer p.Stop()
	keys := []string{q.keys.DLQ, q.keys.Jobs, q.keys.Stats}
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
			o.JobType, keep, o.ID).Slice())
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

// Pacer paces a bulk move at Rate items a second: batches of
// ceil(rate/10) (1..max), one every batch/rate seconds, the first at once;
// an unpaced Pacer (rate 0) gives batches of max and never waits. It waits
// on a ticker and returns as soon as the context ends.
type Pacer struct {
	batch    int
	interval time.Duration
	ticker   *time.Ticker
	started  bool
	skip     bool
}

// NewPacer returns a Pacer of rate items a second (0: unpaced) in batches
// of at most max.
func NewPacer(rate float64, max int) *Pacer {
	if rate <= 0 {
		return &Pacer{batch: max}
	}
	b := int(min(float64(max), math.Max(1, math.Ceil(rate/10))))
	return &Pacer{batch: b, interval: time.Duration(float64(b) / rate * float64(time.Second))}
}

// Batch is how many items each batch may move.
func (p *Pacer) Batch() int { return p.batch }

// Interval is the time between two batches (0: unpaced).
func (p *Pacer) Interval() time.Duration { return p.interval }

// Wait returns when the next batch may go: at once for the first one and
// after a Skip, else at the next tick; the context's error if it ends first.
func (p *Pacer) Wait(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if p.interval <= 0 {
		return nil
	}
	if !p.started {
		p.started = true
		p.ticker = time.NewTicker(p.interval)
		return nil
	}
	if p.skip {
		p.skip = false
		return nil
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-p.ticker.C:
		return nil
	}
}

// Skip lets the next Wait return at once: the batch before moved nothing.
func (p *Pacer) Skip() { p.skip = true }

// Stop releases the ticker.
func (p *Pacer) Stop() {
	if p.ticker != nil {
		p.ticker.Stop()
	}
}

// ParseRate reads a rate as the CLI's --rate takes it: "N/s" (also "N/m",
// "N/h"), N a positive number; it returns items a second.
func ParseRate(s string) (float64, error) {
	num, unit, ok := strings.Cut(s, "/")
	per := map[string]float64{"s": 1, "m": 60, "h": 3600}[unit]
	n, err := strconv.ParseFloat(num, 64)
	if !ok || per == 0 || err != nil || !(n > 0) || math.IsInf(n, 0) || strings.ContainsAny(num, "eExXpP_") {
		return 0, fmt.Errorf("rate must be N/s (or N/m, N/h), N a positive number, got %q", s)
	}
	return n / per, nil
}
