package redisqueue

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// DefaultTypeLimit is how many job types a queue counts by name when its
// stats hash sets no types:limit; the others are counted as "other".
const DefaultTypeLimit = 50

// SetTypeLimit sets how many job types the queue counts by name (the stats
// field types:limit): once that many are registered, a new type is counted
// under "other" and in types:overflow. Types registered already stay
// registered when the limit is lowered.
//
// # Errors
//
// n below 1 is refused before Redis.
func (q *Queue) SetTypeLimit(ctx context.Context, n int) error {
	if n < 1 {
		return fmt.Errorf("queue %s: type limit must be at least 1, got %d", q.name, n)
	}
	if err := q.rdb.HSet(ctx, q.keys.Stats, "types:limit", n).Err(); err != nil {
		return fmt.Errorf("queue %s: set type limit: %w", q.name, err)
	}
	return nil
}

// TypeStats are the job types of a queue as its stats hash counts them.
type TypeStats struct {
	// Registered is how many types are counted by name (types).
	Registered int64 `json:"registered"`
	// Limit is the most types counted by name (types:limit, else
	// DefaultTypeLimit).
	Limit int64 `json:"limit"`
	// Overflow counts the events of types past the limit, counted as
	// "other" (types:overflow).
	Overflow int64 `json:"overflow"`
	// ByType holds each type's counters (the fields t:<type>:<counter>) by
	// type, then counter ("attempts:success"); "other" holds the types past
	// the limit and those that are not valid.
	ByType map[string]map[string]int64 `json:"by_type"`
}

// typeStats reads the per-type counters out of the stats hash's counters.
func typeStats(counters map[string]int64, raw map[string]string) TypeStats {
	ts := TypeStats{Limit: DefaultTypeLimit, ByType: map[string]map[string]int64{}}
	ts.Registered, ts.Overflow = counters["types"], counters["types:overflow"]
	if n, err := strconv.ParseInt(raw["types:limit"], 10, 64); err == nil && n > 0 {
		ts.Limit = n
	}
	for k, v := range counters {
		rest, ok := strings.CutPrefix(k, "t:")
		if !ok {
			continue
		}
		t, field, ok := strings.Cut(rest, ":")
		if !ok {
			continue
		}
		if ts.ByType[t] == nil {
			ts.ByType[t] = map[string]int64{}
		}
		ts.ByType[t][field] = v
	}
	return ts
}
