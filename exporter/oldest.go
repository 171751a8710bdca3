package exporter

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

var oldestJobDesc = newDesc("oldest_job_age_seconds", "Age, from its first_enqueued_ms, of the oldest job not finished yet among the first entry of the jobs stream and the first member of the delayed set (two O(log n) reads): a lower bound of the oldest job's age, exact for a queue worked in order; 0 when both are empty. It grows while a queue is stuck even when nothing fails.", "queue")

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
func readOldestJob(ctx context.Context, p redis.Pipeliner, q Queue, pl plan) func(*sink) {
	if q.Keys.Jobs == "" && q.Keys.Delayed == "" {
		return nil
	}
	var first *redis.XMessageSliceCmd
	var next *redis.ZSliceCmd
	if q.Keys.Jobs != "" {
		first = p.XRangeN(ctx, q.Keys.Jobs, "-", "+", 1)
	}
	if q.Keys.Delayed != "" {
		next = delayedHead(ctx, p, q.Keys.Delayed, pl)
	}
	return func(s *sink) {
		nowMs := pl.now.UnixMilli()
		oldest, found := int64(0), false
		seen := func(ms int64, ok bool) {
			if ok && (!found || ms < oldest) {
				oldest, found = ms, true
			}
		}
		if first != nil {
			if m, err := first.Result(); err == nil && len(m) == 1 {
				seen(entryEnqueuedMs(m[0]))
			} else if err != nil && !isMissing(err) {
				return
			}
		}
		if next != nil {
			if z, err := next.Result(); err == nil && len(z) == 1 {
				member, _ := z[0].Member.(string)
				seen(memberEnqueuedMs(member))
			} else if err != nil {
				return
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
func entryEnqueuedMs(m redis.XMessage) (int64, bool) {
	if f, ok := m.Values["first_enqueued_ms"].(string); ok {
		if ms, err := strconv.ParseInt(f, 10, 64); err == nil {
			return ms, true
		}
	}
	msPart, _, _ := strings.Cut(m.ID, "-")
	ms, err := strconv.ParseInt(msPart, 10, 64)
	return ms, err == nil
}

// memberEnqueuedMs is a delayed member's first_enqueued_ms (retry.lua
// writes it as a string of digits; a number is read too), or false for a
// member that does not say.
func memberEnqueuedMs(member string) (int64, bool) {
	var m struct {
		First json.RawMessage `json:"first_enqueued_ms"`
	}
	if json.Unmarshal([]byte(member), &m) != nil || len(m.First) == 0 {
		return 0, false
	}
	ms, err := strconv.ParseInt(strings.Trim(string(m.First), `"`), 10, 64)
	return ms, err == nil
}
