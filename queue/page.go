package queue

import (
	"fmt"
	"time"
)

// A page of the DLQ: what a console lists, with bounded work per request
// whatever the DLQ's size (issue 46): a Page looks at most Scan dead
// letters from its cursor, never the whole DLQ.

// Page bounds.
const (
	// MaxPageLimit is the most dead letters one Page returns.
	MaxPageLimit = 500
	// MaxPageScan is the most dead letters one Page looks at.
	MaxPageScan = 10_000
	// MaxPreview is the most bytes of a payload a Page keeps.
	MaxPreview = 64 << 10
	// DefaultPreview is the bytes of a payload kept when PageOptions.Preview is 0.
	DefaultPreview = 1024
)

// PageOptions select one page of the DLQ.
type PageOptions struct {
	// Cursor is where the page starts: "" the DLQ's start (the newest on
	// a broker that reads its DLQ from either end, Redis; else the
	// oldest), else a DLQPage.Next or a Letter.Cursor (that dead
	// letter first). It is the broker's own and opaque.
	Cursor string
	// Limit is the most dead letters returned: 1..MaxPageLimit.
	Limit int
	// Scan is the most dead letters looked at (the filter's cost): 0 =
	// 10 × Limit, at most MaxPageScan; at least Limit.
	Scan int
	// Reason, JobType and ID keep only the dead letters with this reason,
	// of this job type, of this job id ("" = any).
	Reason, JobType, ID string
	// Since and Until keep only the dead letters dead-lettered in
	// [Since, Until) (zero = unbounded).
	Since, Until time.Time
	// Preview is how many bytes of each payload are kept: 0 =
	// DefaultPreview, at most MaxPreview.
	Preview int
}

// DLQPage is one page of the DLQ.
type DLQPage struct {
	Letters []Letter
	// Next is the cursor of the next page; "" when the DLQ (or the time
	// range) has no more.
	Next string
	// Scanned is how many dead letters the page looked at.
	Scanned int
	// Newest: the page runs newest first (Redis); else oldest first.
	Newest bool
}

// Letter is one dead letter as a Page reads it: its figures and the
// broker's record, the payload's start.
type Letter struct {
	// Cursor starts a Page at this dead letter ("" on a broker that
	// cannot: RabbitMQ, where PageOptions.ID finds it).
	Cursor  string
	EntryID string // the broker's id of the message ("" when it has none)
	JobID   string
	Type    string // the job type ("": untyped)
	Attempt string // as the broker holds it: a malformed one shows
	Reason  string
	Error   string // the last error
	// DeadLettered is when the job was dead-lettered (zero: unknown).
	DeadLettered time.Time
	// Payload is the payload's first PageOptions.Preview bytes, as they
	// are (maybe not UTF-8); PayloadSize its whole length.
	Payload     []byte
	PayloadSize int
	// Fields are the broker's record of the dead letter, each as text:
	// the Redis entry's fields but the payload, or the RabbitMQ message's
	// headers (x-death as JSON).
	Fields map[string]string
}

// CheckPage returns o with its defaults applied, or why it cannot run:
// every broker's Page calls it before it touches the broker.
func CheckPage(o PageOptions) (PageOptions, error) {
	if o.Limit < 1 || o.Limit > MaxPageLimit {
		return o, fmt.Errorf("limit must be in 1..%d, got %d", MaxPageLimit, o.Limit)
	}
	if o.Scan == 0 {
		o.Scan = min(MaxPageScan, max(o.Limit, 10*o.Limit))
	}
	if o.Scan < o.Limit || o.Scan > MaxPageScan {
		return o, fmt.Errorf("scan must be in %d..%d (limit..%d), got %d", o.Limit, MaxPageScan, MaxPageScan, o.Scan)
	}
	if o.Preview == 0 {
		o.Preview = DefaultPreview
	}
	if o.Preview < 0 || o.Preview > MaxPreview {
		return o, fmt.Errorf("preview must be in 0..%d bytes, got %d", MaxPreview, o.Preview)
	}
	if o.JobType != "" {
		if err := ValidJobType(o.JobType); err != nil {
			return o, err
		}
	}
	if !o.Since.IsZero() && !o.Until.IsZero() && !o.Since.Before(o.Until) {
		return o, fmt.Errorf("since (%s) must be before until (%s)", o.Since.Format(time.RFC3339), o.Until.Format(time.RFC3339))
	}
	return o, nil
}

// Match reports whether d passes o's filter.
func (o PageOptions) Match(d Letter) bool {
	return (o.Reason == "" || d.Reason == o.Reason) && (o.JobType == "" || d.Type == o.JobType) &&
		(o.ID == "" || d.JobID == o.ID) &&
		(o.Since.IsZero() || (!d.DeadLettered.IsZero() && !d.DeadLettered.Before(o.Since))) &&
		(o.Until.IsZero() || (!d.DeadLettered.IsZero() && d.DeadLettered.Before(o.Until)))
}

// Cut returns the first n bytes of p (all of it when shorter).
func Cut(p []byte, n int) []byte {
	if len(p) > n {
		p = p[:n]
	}
	return append([]byte(nil), p...)
}
