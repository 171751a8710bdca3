package queue

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// What every broker's DLQ workflow shares (redisqueue/README.md and
// rabbitmq/README.md, "The DLQ workflow"): the discard's actions and bounds,
// and the pacing of a bulk replay.

// MaxNoteLen and MaxActorLen bound a discard's note (why) and actor (who).
const (
	MaxNoteLen  = 1024
	MaxActorLen = 256
)

// DiscardAction names what an operator did: delete (one job's dead letters)
// or purge (every dead letter that matches).
type DiscardAction string

const (
	DiscardDelete DiscardAction = "delete"
	DiscardPurge  DiscardAction = "purge"
)

// The other writes the audit records (with an actor): a dead letter
// replayed, a delayed job run now.
const (
	AuditReplay DiscardAction = "replay"
	AuditRun    DiscardAction = "run"
)

// CheckActor reports why an actor given to Replay or Run cannot be
// recorded: "" (record nothing) or 1..MaxActorLen bytes.
func CheckActor(actor string) error {
	if len(actor) > MaxActorLen {
		return fmt.Errorf("the actor (who) must be at most %d bytes, got %d", MaxActorLen, len(actor))
	}
	return nil
}

// CheckDiscard reports why a discard cannot run, or nil: every broker's
// Discard checks its action, job id (required to delete), note (why),
// actor (who) and limit (0: every one) before it touches the broker.
func CheckDiscard(action DiscardAction, id, note, actor string, limit int) error {
	switch {
	case action != DiscardDelete && action != DiscardPurge:
		return fmt.Errorf("action must be %q or %q, got %q", DiscardDelete, DiscardPurge, action)
	case action == DiscardDelete && id == "":
		return fmt.Errorf("delete needs a job id")
	case len(note) < 1 || len(note) > MaxNoteLen:
		return fmt.Errorf("the note (why) must be 1..%d bytes, got %d", MaxNoteLen, len(note))
	case len(actor) < 1 || len(actor) > MaxActorLen:
		return fmt.Errorf("the actor (who) must be 1..%d bytes, got %d", MaxActorLen, len(actor))
	case limit < 0:
		return fmt.Errorf("limit must be >= 0 (0: every one), got %d", limit)
	}
	return nil
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
