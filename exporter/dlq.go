package exporter

import (
	"strconv"

	"github.com/backstop-dev/backstop/internal/resp"
)

var (
	dlqSizeDesc     = newDesc("dlq_size", "Entries in the dead letter stream (XLEN).", "queue")
	dlqIngestedDesc = newDesc("dlq_ingested_total", "Entries ever added to the dead letter stream (XINFO STREAM entries-added): counts past trimming, for the DLQ ingestion rate. On a server that does not report entries-added (Redis 6, the embedded server of backstop demo) it is the dead letters the queue scripts wrote (stats hash attempts:dead_letter), and absent when those cannot account for the stream's entries.", "queue")
)

// scriptDeadLetters is the stats field the queue scripts increment in the
// same step as each XADD to the DLQ (dead_letter.lua, and reclaim.lua for
// a crash loop), and at no other time: the count of dead letters they
// wrote, which equals entries-added while every write to the DLQ goes
// through them.
const scriptDeadLetters = "attempts:dead_letter"

// dlqRead is one queue's DLQ read, queued on a pipeline: XINFO STREAM of
// the DLQ, which gives its length and entries-added, and the scripts'
// count of dead letters for a server that does not report entries-added.
// The collector and the alerter read the DLQ through it, so both give the
// same figure.
type dlqRead struct {
	p       *resp.Pipe
	info    resp.Ref
	scripts resp.Ref // HGET of the count; noRef when the queue has no stats hash, or stats is read
	// stats is the whole stats hash when the scrape reads it anyway
	// (statsHash): the count is taken from it, one command less.
	stats resp.Ref
}

// noRef is a command not queued.
const noRef = resp.NoRef

// queueDLQRead queues q's DLQ read on p; nil when q has no DLQ. In a
// scrape (pl not nil) the scripts' count comes from the stats hash the
// scrape reads anyway (statsHash), else from an HGET of its own.
func queueDLQRead(p *resp.Pipe, q Queue, pl *plan) *dlqRead {
	if q.Keys.DLQ == "" {
		return nil
	}
	r := &dlqRead{p: p, info: p.Do("XINFO", "STREAM", q.Keys.DLQ), scripts: noRef, stats: noRef}
	switch {
	case q.Keys.Stats == "":
	case pl != nil:
		r.stats = statsHash(p, q.Keys.Stats, *pl)
	default:
		r.scripts = p.Do("HGET", q.Keys.Stats, scriptDeadLetters)
	}
	return r
}

// dlqFigures are what a DLQ read tells.
type dlqFigures struct {
	size     int64 // entries now (XLEN)
	ingested int64 // entries ever added, when known
	known    bool  // whether ingested is known
}

// result returns the DLQ's figures once the pipeline has run. A DLQ that
// does not exist yet is empty and has had nothing added. The error is
// XINFO STREAM's.
//
// ingested is entries-added when the server reports it. Otherwise it is
// the scripts' count, when that is at least the stream's length: a DLQ
// holding more entries than the scripts wrote was written by something
// else too (an older tool, a hand XADD), so no count of the server's
// covers it and ingested is unknown. So is it when the stats hash cannot
// be read (readStats reports that error).
func (r *dlqRead) result() (dlqFigures, error) {
	v := r.p.Reply(r.info)
	err := v.Err()
	if err == nil && v.IsNil() {
		err = resp.ErrNoReply
	}
	switch {
	case err == nil:
	case isMissing(err):
		return dlqFigures{known: true}, nil
	default:
		return dlqFigures{}, err
	}
	size, ok := v.Field("length").Int()
	if !ok {
		return dlqFigures{}, badReply("XINFO STREAM reply without a length: " + v.String())
	}
	f := dlqFigures{size: size}
	if added, ok := v.Field("entries-added").Int(); ok {
		f.ingested, f.known = added, true
		return f, nil
	}
	var count resp.Reply // the scripts' count; nil when the hash has none
	switch {
	case r.stats != noRef:
		hash := r.p.Reply(r.stats)
		if hash.Err() != nil {
			return f, nil
		}
		count = hash.Field(scriptDeadLetters)
	case r.scripts != noRef:
		count = r.p.Reply(r.scripts)
		if count.Err() != nil {
			return f, nil
		}
	default:
		return f, nil
	}
	n := int64(0)
	if !count.IsNil() {
		raw, _ := count.Str()
		if n, err = strconv.ParseInt(raw, 10, 64); err != nil {
			return f, nil
		}
	}
	if n >= size {
		f.ingested, f.known = n, true
	}
	return f, nil
}

// readDLQ reads the dead letter stream (dlqRead). dlq_ingested_total is
// left out when it is not known: never a 0 that only means "not reported".
func readDLQ(p *resp.Pipe, q Queue, pl plan) func(*sink) {
	r := queueDLQRead(p, q, &pl)
	if r == nil {
		return nil
	}
	return func(s *sink) {
		f, err := r.result()
		if err != nil {
			s.fail(q, q.Keys.DLQ, err)
			return
		}
		if p.Reply(r.info).Err() == nil {
			s.seen(q) // the stream exists, empty or not
		}
		s.gauge(dlqSizeDesc, float64(f.size), q.Name)
		if f.known {
			s.counter(dlqIngestedDesc, float64(f.ingested), q.Name)
		}
	}
}

// statsHash queues HGETALL key once per pipeline: readStats reports the
// whole stats hash, and readDLQ takes the scripts' dead letters from it
// (for a server without entries-added) instead of an HGET of its own.
func statsHash(p *resp.Pipe, key string, pl plan) resp.Ref {
	if c, ok := pl.stats[key]; ok {
		return c
	}
	c := p.Do("HGETALL", key)
	if pl.stats != nil {
		pl.stats[key] = c
	}
	return c
}
