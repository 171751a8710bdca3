package exporter

import (
	"strconv"

	"github.com/backstop-dev/backstop/internal/resp"
)

var (
	delayedSizeDesc    = newDesc("delayed_queue_size", "Jobs waiting in the delayed set for a cold retry (ZCARD).", "queue")
	delayedOverdueDesc = newDesc("delayed_overdue_jobs", "Delayed jobs whose due time has passed but that are not promoted yet (ZCOUNT -inf now): a stalled scheduler.", "queue")
	delayedOldestDesc  = newDesc("delayed_oldest_overdue_seconds", "How long the oldest overdue delayed job has been due, 0 when none is overdue.", "queue")
)

// readDelayed reads the delayed set with three O(log n) commands. "Now" is
// the exporter's clock, the scores the Redis server's: keep them in sync.
func readDelayed(p *resp.Pipe, q Queue, pl plan) func(*sink) {
	key := q.Keys.Delayed
	if key == "" {
		return nil
	}
	nowMs := pl.now.UnixMilli()
	size := p.Do("ZCARD", key)
	overdue := p.Do("ZCOUNT", key, "-inf", strconv.FormatInt(nowMs, 10))
	oldest := delayedHead(p, key, pl)
	return func(s *sink) {
		for _, c := range []resp.Ref{size, overdue, oldest} {
			if err := p.Reply(c).Err(); err != nil {
				s.fail(q, key, err)
				return
			}
		}
		n, ok := p.Reply(size).Int()
		due, ok2 := p.Reply(overdue).Int()
		if !ok || !ok2 {
			s.fail(q, key, badReply("ZCARD or ZCOUNT reply is not an integer: "+p.Reply(size).String()+" "+p.Reply(overdue).String()))
			return
		}
		age := 0.0
		if _, score, ok := zHead(p.Reply(oldest)); ok && score <= float64(nowMs) {
			age = (float64(nowMs) - score) / 1000
		}
		s.gauge(delayedSizeDesc, float64(n), q.Name)
		s.gauge(delayedOverdueDesc, float64(due), q.Name)
		s.gauge(delayedOldestDesc, age, q.Name)
	}
}

// delayedHead queues ZRANGE key 0 0 WITHSCORES once per pipeline: both
// readDelayed (the score: how long it has been overdue) and readOldestJob
// (the member: its job's first enqueue time) read the delayed set's first
// member: one command per queue less for Redis.
func delayedHead(p *resp.Pipe, key string, pl plan) resp.Ref {
	if c, ok := pl.heads[key]; ok {
		return c
	}
	c := p.Do("ZRANGE", key, "0", "0", "WITHSCORES")
	if pl.heads != nil {
		pl.heads[key] = c
	}
	return c
}

// zHead reads the reply of ZRANGE key 0 0 WITHSCORES: the member and its
// score, flat in RESP2, a pair in RESP3.
func zHead(v resp.Reply) (member []byte, score float64, ok bool) {
	m, sc := v.First(), resp.Reply{}
	if m.Len() == 2 { // RESP3: [[member score]]
		m, sc = m.First(), m.First().Next()
	} else if v.Len() == 2 {
		sc = m.Next()
	} else {
		return nil, 0, false
	}
	score, ok = sc.Float()
	return m.Bytes(), score, ok
}
