package exporter

import (
	"strconv"
)

var (
	delayedSizeDesc    = newDesc("delayed_queue_size", "Jobs waiting in the delayed set for a cold retry (ZCARD).", "queue")
	delayedOverdueDesc = newDesc("delayed_overdue_jobs", "Delayed jobs whose due time has passed but that are not promoted yet (ZCOUNT -inf now): a stalled scheduler.", "queue")
	delayedOldestDesc  = newDesc("delayed_oldest_overdue_seconds", "How long the oldest overdue delayed job has been due, 0 when none is overdue.", "queue")
)

// readDelayed reads the delayed set with three O(log n) commands. "Now" is
// the exporter's clock, the scores the Redis server's: keep them in sync.
func readDelayed(p *pipe, q Queue, pl plan) func(*sink) {
	key := q.Keys.Delayed
	if key == "" {
		return nil
	}
	nowMs := pl.now.UnixMilli()
	size := p.do("ZCARD", key)
	overdue := p.do("ZCOUNT", key, "-inf", strconv.FormatInt(nowMs, 10))
	oldest := delayedHead(p, key, pl)
	return func(s *sink) {
		for _, c := range []ref{size, overdue, oldest} {
			if err := p.reply(c).err(); err != nil {
				s.fail(q, key, err)
				return
			}
		}
		n, ok := p.reply(size).int()
		due, ok2 := p.reply(overdue).int()
		if !ok || !ok2 {
			s.fail(q, key, badReply("ZCARD or ZCOUNT reply is not an integer: "+p.reply(size).String()+" "+p.reply(overdue).String()))
			return
		}
		age := 0.0
		if _, score, ok := zHead(p.reply(oldest)); ok && score <= float64(nowMs) {
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
func delayedHead(p *pipe, key string, pl plan) ref {
	if c, ok := pl.heads[key]; ok {
		return c
	}
	c := p.do("ZRANGE", key, "0", "0", "WITHSCORES")
	if pl.heads != nil {
		pl.heads[key] = c
	}
	return c
}

// zHead reads the reply of ZRANGE key 0 0 WITHSCORES: the member and its
// score, flat in RESP2, a pair in RESP3.
func zHead(v reply) (member []byte, score float64, ok bool) {
	m, sc := v.first(), reply{}
	if m.len() == 2 { // RESP3: [[member score]]
		m, sc = m.first(), m.first().next()
	} else if v.len() == 2 {
		sc = m.next()
	} else {
		return nil, 0, false
	}
	score, ok = sc.float()
	return m.bytes(), score, ok
}
