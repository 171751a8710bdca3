package exporter

import (
	"maps"
	"slices"

	"github.com/backstop-dev/backstop/internal/resp"
)

var queueFoundDesc = newDesc("queue_found", "Whether any key of the queue exists (1: jobs stream, delayed set, dead letters or stats hash), or none does (0): a queue name that is misspelt, or a queue that was never used; its other metrics are then zeros, not a healthy queue.", "queue")

// readFound reports backstop_queue_found from the replies the other
// readers asked for, with no command of its own: the stats hash and the
// delayed set's head are shared through the plan (statsHash, delayedHead;
// an empty hash or set does not exist in Redis), and the jobs and dead
// letter streams, which may exist empty, are marked seen by readStreams
// and readDLQ (sink.seen), whose replies are read before this one's: it
// is the last reader. The scrape logs a queue not found (noteFound).
func readFound(p *resp.Pipe, q Queue, pl plan) func(*sink) {
	var refs []resp.Ref
	if q.Keys.Stats != "" {
		refs = append(refs, statsHash(p, q.Keys.Stats, pl))
	}
	if q.Keys.Delayed != "" {
		refs = append(refs, delayedHead(p, q.Keys.Delayed, pl))
	}
	return func(s *sink) {
		found := s.queueFound[q.Name]
		for _, r := range refs {
			v := p.Reply(r)
			if v.Err() != nil {
				return // reported by the reader that owns the key
			}
			found = found || v.Len() > 0
		}
		if s.queueFound == nil {
			s.queueFound = map[string]bool{}
		}
		s.queueFound[q.Name] = found
		v := 0.0
		if found {
			v = 1
		}
		s.gauge(queueFoundDesc, v, q.Name)
	}
}

// seen records that a key of queue q exists (a stream, which may be
// empty): readFound reports the queue found.
func (s *sink) seen(q Queue) {
	if s.queueFound == nil {
		s.queueFound = map[string]bool{}
	}
	s.queueFound[q.Name] = true
}

// noteFound logs each queue a scrape did not find, once until it is found
// again ("queue not found", a warning), and each one found again.
func (c *Collector) noteFound(s *sink) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.missing == nil {
		c.missing = map[string]bool{}
	}
	for _, n := range slices.Sorted(maps.Keys(s.queueFound)) {
		switch found := s.queueFound[n]; {
		case !found && !c.missing[n]:
			c.cfg.log.Warn("queue not found: none of its keys exists; check its name (--queues, --queues.config)", "queue", n)
			c.missing[n] = true
		case found && c.missing[n]:
			c.cfg.log.Info("queue found", "queue", n)
			delete(c.missing, n)
		}
	}
}
