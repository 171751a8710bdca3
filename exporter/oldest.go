package exporter

import (
	"encoding/json"
	"strconv"
	"strings"

	"github.com/backstop-dev/backstop/internal/resp"
)

var oldestJobDesc = newDesc("oldest_job_age_seconds", "Age of the oldest job not finished yet, a lower bound, exact for a queue worked in order; 0 when none waits. Redis: from its first_enqueued_ms, among the first entry of the jobs stream and the first member of the delayed set (two O(log n) reads). RabbitMQ: since the oldest message of the work queue (ready or held by a worker) arrived in it, from the queue's arrival counts over the exporter's scrapes (no message is read), so at most the exporter's uptime; the delay levels are not included. It grows while a queue is stuck even when nothing fails.", "queue")

// readOldestJob reads the first entry of the jobs stream (XRANGE - + COUNT
// 1: the scripts delete finished entries, so it is the oldest one left) and
// the first member of the delayed set (the next one due), and reports the
// older of their jobs' first enqueue times.
//
// # Notes
//
// The delayed set is ordered by due time and a promoted retry gets a new
// stream id, so a job further in could be older: finding it would read the
// whole set. The head of both is what a stuck queue keeps, and what a
// stalled scheduler leaves overdue: the age of those grows until it pages.
// Errors on these keys are the stream and delayed readers' to report.
func readOldestJob(p *resp.Pipe, q Queue, pl plan) func(*sink) {
	if q.Keys.Jobs == "" && q.Keys.Delayed == "" {
		return nil
	}
	first, next := noRef, noRef
	if q.Keys.Jobs != "" {
		first = p.Do("XRANGE", q.Keys.Jobs, "-", "+", "COUNT", "1")
	}
	if q.Keys.Delayed != "" {
		next = delayedHead(p, q.Keys.Delayed, pl)
	}
	return func(s *sink) {
		nowMs := pl.now.UnixMilli()
		oldest, found := int64(0), false
		seen := func(ms int64, ok bool) {
			if ok && (!found || ms < oldest) {
				oldest, found = ms, true
			}
		}
		if first != noRef {
			v := p.Reply(first)
			if err := v.Err(); err != nil && !isMissing(err) {
				return // reported by the stream's reader
			} else if err == nil && v.Len() == 1 {
				seen(entryEnqueuedMs(v.First()))
			}
		}
		if next != noRef {
			v := p.Reply(next)
			if v.Err() != nil {
				return // reported by readDelayed
			}
			if member, _, ok := zHead(v); ok {
				seen(memberEnqueuedMs(member))
			}
		}
		age := 0.0
		if found {
			age = max(0, float64(nowMs-oldest)/1000)
		}
		s.gauge(oldestJobDesc, age, q.Name)
	}
}

// entryEnqueuedMs is a stream entry's first_enqueued_ms, or the time of its
// id for an entry without one (a layout the scripts did not write).
func entryEnqueuedMs(entry resp.Reply) (int64, bool) {
	id := entry.First()
	var fields resp.Reply // nil: an entry without fields
	if entry.Len() == 2 {
		fields = id.Next()
	}
	if f, ok := fields.Field("first_enqueued_ms").Str(); ok {
		if ms, err := strconv.ParseInt(f, 10, 64); err == nil {
			return ms, true
		}
	}
	return idMs(id.Bytes())
}

// idMs is the time of a stream entry id ("<ms>-<seq>").
func idMs(id []byte) (int64, bool) {
	msPart, _, _ := strings.Cut(string(id), "-")
	ms, err := strconv.ParseInt(msPart, 10, 64)
	return ms, err == nil
}

// memberEnqueuedMs is a delayed member's first_enqueued_ms (retry.lua
// writes it as a string of digits; a number is read too), or false for a
// member that does not say.
func memberEnqueuedMs(member []byte) (int64, bool) {
	var m struct {
		First json.RawMessage `json:"first_enqueued_ms"`
	}
	if json.Unmarshal(member, &m) != nil || len(m.First) == 0 {
		return 0, false
	}
	ms, err := strconv.ParseInt(strings.Trim(string(m.First), `"`), 10, 64)
	return ms, err == nil
}
