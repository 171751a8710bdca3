package exporter

import (
	"context"
	"strconv"

	"github.com/redis/go-redis/v9"
)

var (
	delayedSizeDesc    = newDesc("delayed_queue_size", "Jobs waiting in the delayed set for a cold retry (ZCARD).", "queue")
	delayedOverdueDesc = newDesc("delayed_overdue_jobs", "Delayed jobs whose due time has passed but that are not promoted yet (ZCOUNT -inf now): a stalled scheduler.", "queue")
	delayedOldestDesc  = newDesc("delayed_oldest_overdue_seconds", "How long the oldest overdue delayed job has been due, 0 when none is overdue.", "queue")
)

// readDelayed reads the delayed set with three O(log n) commands. "Now" is
// the exporter's clock, the scores the Redis server's: keep them in sync.
func readDelayed(ctx context.Context, p redis.Pipeliner, q Queue, pl plan) func(*sink) {
	key := q.Keys.Delayed
	if key == "" {
		return nil
	}
	nowMs := pl.now.UnixMilli()
	size := p.ZCard(ctx, key)
	overdue := p.ZCount(ctx, key, "-inf", strconv.FormatInt(nowMs, 10))
	oldest := delayedHead(ctx, p, key, pl)
	return func(s *sink) {
		for _, err := range []error{size.Err(), overdue.Err(), oldest.Err()} {
			if err != nil {
				s.fail(q, key, err)
				return
			}
		}
		age := 0.0
		if z := oldest.Val(); len(z) == 1 && z[0].Score <= float64(nowMs) {
			age = (float64(nowMs) - z[0].Score) / 1000
		}
		s.gauge(delayedSizeDesc, float64(size.Val()), q.Name)
		s.gauge(delayedOverdueDesc, float64(overdue.Val()), q.Name)
		s.gauge(delayedOldestDesc, age, q.Name)
	}
}

// delayedHead queues ZRANGE key 0 0 WITHSCORES once per pipeline: both
// readDelayed (the score: how long it has been overdue) and readOldestJob
// (the member: its job's first enqueue time) read the delayed set's first
// member: one command per queue less for Redis.
func delayedHead(ctx context.Context, p redis.Pipeliner, key string, pl plan) *redis.ZSliceCmd {
	if cmd, ok := pl.heads[key]; ok {
		return cmd
	}
	cmd := p.ZRangeWithScores(ctx, key, 0, 0)
	if pl.heads != nil {
		pl.heads[key] = cmd
	}
	return cmd
}
