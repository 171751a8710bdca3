package redisqueue

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/queue"
)

// pageChunk is the most entries one XREVRANGE of a Page reads.
const pageChunk = 500

// Page reads the DLQ newest first from o.Cursor (an entry id: that entry
// first; "(id": the entries older than id) with XREVRANGE, at most o.Scan
// entries in chunks of pageChunk, the time range mapped onto the entry ids
// (an entry's id is the time it was dead-lettered). Unfiltered, it is one
// XREVRANGE of Limit+1 entries.
func (b *brokerQueue) Page(ctx context.Context, o queue.PageOptions) (queue.DLQPage, error) {
	fail := func(err error) error { return fmt.Errorf("queue %s: page: %w", b.q.name, err) }
	o, err := queue.CheckPage(o)
	if err != nil {
		return queue.DLQPage{}, fail(err)
	}
	end, start := "+", "-"
	if o.Cursor != "" {
		if !validCursor(o.Cursor) {
			return queue.DLQPage{}, fail(fmt.Errorf("cursor must be a stream entry id (or \"(\" and one), got %q", o.Cursor))
		}
		end = o.Cursor
	}
	if !o.Until.IsZero() {
		// Entries before Until: ids up to (Until ms - 1)-max.
		u := "(" + strconv.FormatInt(o.Until.UnixMilli(), 10) + "-0"
		if end == "+" || laterCursor(end, u) {
			end = u
		}
	}
	if !o.Since.IsZero() {
		start = strconv.FormatInt(o.Since.UnixMilli(), 10) + "-0"
	}
	filtered := o.Reason != "" || o.JobType != "" || o.ID != ""
	page := queue.DLQPage{Newest: true}
	for page.Scanned < o.Scan {
		n := min(pageChunk, o.Scan-page.Scanned)
		if !filtered {
			n = min(n, o.Limit-len(page.Letters)+1) // one more: is there a next page
		}
		msgs, err := b.q.rdb.XRevRangeN(ctx, b.q.keys.DLQ, end, start, int64(n)).Result()
		if err != nil {
			return page, fail(err)
		}
		for i, m := range msgs {
			if len(page.Letters) == o.Limit {
				page.Next = m.ID
				return page, nil
			}
			page.Scanned++
			d := letterOf(m, o.Preview)
			if o.Match(d) {
				page.Letters = append(page.Letters, d)
			}
			if page.Scanned == o.Scan && (i < len(msgs)-1 || len(msgs) == n) {
				page.Next = "(" + m.ID // the scan's bound, not the DLQ's end
				return page, nil
			}
		}
		if len(msgs) < n {
			return page, nil // the DLQ's (or the range's) end
		}
		end = "(" + msgs[len(msgs)-1].ID
	}
	return page, nil
}

// letterOf reads a DLQ entry.
func letterOf(m redis.XMessage, preview int) queue.Letter {
	payload := str(m.Values, "payload")
	d := queue.Letter{Cursor: m.ID, EntryID: m.ID, JobID: str(m.Values, "id"), Type: str(m.Values, "type"),
		Attempt: str(m.Values, "attempt"), Reason: str(m.Values, "reason"), Error: str(m.Values, "error"),
		Payload: queue.Cut([]byte(payload), preview), PayloadSize: len(payload), Fields: map[string]string{}}
	if ms, err := strconv.ParseInt(str(m.Values, "dead_lettered_ms"), 10, 64); err == nil {
		d.DeadLettered = time.UnixMilli(ms)
	} else if ms, err := strconv.ParseInt(strings.SplitN(m.ID, "-", 2)[0], 10, 64); err == nil {
		d.DeadLettered = time.UnixMilli(ms)
	}
	for k := range m.Values {
		if k != "payload" {
			d.Fields[k] = str(m.Values, k)
		}
	}
	return d
}

// validCursor reports whether c is a stream entry id, maybe after "(".
func validCursor(c string) bool {
	ms, seq, ok := strings.Cut(strings.TrimPrefix(c, "("), "-")
	_, e1 := strconv.ParseUint(ms, 10, 64)
	_, e2 := strconv.ParseUint(seq, 10, 64)
	return ok && e1 == nil && e2 == nil
}

// laterCursor reports whether cursor a bounds a reverse range above b: ids
// compared as (ms, seq), "(id" just below id.
func laterCursor(a, b string) bool {
	pa, pb := cursorKey(a), cursorKey(b)
	for i := range pa {
		if pa[i] != pb[i] {
			return pa[i] > pb[i]
		}
	}
	return false
}

func cursorKey(c string) [3]uint64 {
	ms, seq, _ := strings.Cut(strings.TrimPrefix(c, "("), "-")
	m, _ := strconv.ParseUint(ms, 10, 64)
	s, _ := strconv.ParseUint(seq, 10, 64)
	incl := uint64(1)
	if strings.HasPrefix(c, "(") {
		incl = 0
	}
	return [3]uint64{m, s, incl}
}

// Audit reads the newest limit records of the audit stream: one
// XREVRANGE.
func (b *brokerQueue) Audit(ctx context.Context, limit int) ([]queue.AuditRecord, error) {
	if limit < 1 || limit > queue.MaxAuditRead {
		return nil, fmt.Errorf("queue %s: audit: limit must be in 1..%d, got %d", b.q.name, queue.MaxAuditRead, limit)
	}
	msgs, err := b.q.rdb.XRevRangeN(ctx, b.q.AuditKey(), "+", "-", int64(limit)).Result()
	if err != nil {
		return nil, fmt.Errorf("queue %s: audit: %w", b.q.name, err)
	}
	out := make([]queue.AuditRecord, 0, len(msgs))
	for _, m := range msgs {
		r := queue.AuditRecord{Action: queue.DiscardAction(str(m.Values, "action")), Note: str(m.Values, "note"),
			Actor: str(m.Values, "actor"), JobID: str(m.Values, "id"), Reason: str(m.Values, "reason")}
		if ms, err := strconv.ParseInt(str(m.Values, "at_ms"), 10, 64); err == nil {
			r.At = time.UnixMilli(ms)
		}
		out = append(out, r)
	}
	return out, nil
}
