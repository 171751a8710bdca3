package redisqueue

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/queue"
)

// Stats is a queue's state: sizes read live, counters from the stats hash.
// The JSON keys are snake_case, like every output of backstop.
type Stats struct {
	Jobs     int64            `json:"jobs"`
	Pending  int64            `json:"pending"`
	Delayed  int64            `json:"delayed"`
	DLQ      int64            `json:"dlq"`
	Counters map[string]int64 `json:"counters"` // the stats hash, e.g. "attempts:success"
	// Types are the per-type counters (the fields t:<type>:...) and the
	// registry of types counted by name.
	Types TypeStats `json:"types"`
}

// Stats reads the queue's sizes and counters in one pipelined round trip.
func (q *Queue) Stats(ctx context.Context) (Stats, error) {
	var jobs, dlq *redis.IntCmd
	var delayed *redis.IntCmd
	var pending *redis.XPendingCmd
	var hash *redis.MapStringStringCmd
	_, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		jobs = p.XLen(ctx, q.keys.Jobs)
		pending = p.XPending(ctx, q.keys.Jobs, q.group)
		delayed = p.ZCard(ctx, q.keys.Delayed)
		dlq = p.XLen(ctx, q.keys.DLQ)
		hash = p.HGetAll(ctx, q.keys.Stats)
		return nil
	})
	if err != nil && !isNoGroup(err) {
		return Stats{}, fmt.Errorf("queue %s: stats: %w", q.name, err)
	}
	s := Stats{Jobs: jobs.Val(), Delayed: delayed.Val(), DLQ: dlq.Val(), Counters: map[string]int64{}}
	if pending.Err() == nil {
		s.Pending = pending.Val().Count
	}
	for k, v := range hash.Val() {
		n, _ := strconv.ParseInt(v, 10, 64)
		s.Counters[k] = n
	}
	s.Types = typeStats(s.Counters, hash.Val())
	return s, nil
}

func isNoGroup(err error) bool { return strings.Contains(err.Error(), "NOGROUP") }

// DeadLetter is one entry of the dead letter stream.
type DeadLetter struct {
	EntryID string            `json:"entry_id"`
	JobID   string            `json:"job_id"`
	Reason  string            `json:"reason"`
	Error   string            `json:"error"`
	Attempt string            `json:"attempt"`
	Type    string            `json:"type,omitempty"` // the job type; "" untyped
	Fields  map[string]string `json:"fields"`
}

// DLQReport is what `backstop dlq inspect` shows.
type DLQReport struct {
	Size     int64            `json:"size"`
	Scanned  int64            `json:"scanned"`
	ByReason map[string]int64 `json:"by_reason"`
	Newest   []DeadLetter     `json:"newest"`
}

// InspectDLQ counts the dead letters by reason (scanning at most maxScan
// entries, oldest first) and returns the newest n.
func (q *Queue) InspectDLQ(ctx context.Context, newest int, maxScan int64) (DLQReport, error) {
	r := DLQReport{ByReason: map[string]int64{}}
	var err error
	if r.Size, err = q.rdb.XLen(ctx, q.keys.DLQ).Result(); err != nil {
		return r, fmt.Errorf("queue %s: dlq: %w", q.name, err)
	}
	start := "-"
	for r.Scanned < maxScan {
		page, err := q.rdb.XRangeN(ctx, q.keys.DLQ, start, "+", min(1000, maxScan-r.Scanned)).Result()
		if err != nil {
			return r, fmt.Errorf("queue %s: dlq: %w", q.name, err)
		}
		for _, m := range page {
			r.ByReason[str(m.Values, "reason")]++
		}
		r.Scanned += int64(len(page))
		if len(page) < 1000 {
			break
		}
		start = "(" + page[len(page)-1].ID
	}
	msgs, err := q.rdb.XRevRangeN(ctx, q.keys.DLQ, "+", "-", int64(newest)).Result()
	if err != nil {
		return r, fmt.Errorf("queue %s: dlq: %w", q.name, err)
	}
	for _, m := range msgs {
		d := DeadLetter{EntryID: m.ID, JobID: str(m.Values, "id"), Reason: str(m.Values, "reason"),
			Error: str(m.Values, "error"), Attempt: str(m.Values, "attempt"), Type: str(m.Values, "type"), Fields: map[string]string{}}
		for k := range m.Values {
			d.Fields[k] = str(m.Values, k)
		}
		r.Newest = append(r.Newest, d)
	}
	return r, nil
}

// Reasons returns the report's reasons, most frequent first.
func (r DLQReport) Reasons() []string { return queue.DLQReport{ByReason: r.ByReason}.Reasons() }

func str(m map[string]any, k string) string { s, _ := m[k].(string); return s }
