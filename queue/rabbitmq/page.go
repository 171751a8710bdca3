package rabbitmq

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/backstop-dev/backstop/queue"
)

// Page reads Q.dlq from its head with basic.get, at most o.Scan dead
// letters whatever the DLQ's size, and puts each one it looked at back at
// the tail, in order (published again, confirmed, then acked: toTail),
// whichever way the broker would requeue it: the next page is the head
// again. Its cursor is "looked/size": how many of the size the listing
// started with were looked at so far; the listing ends when every one was.
// A page moves the DLQ's order (a replay takes from the head), and a
// worker or replay at the same time can make a listing show a dead letter
// twice or miss one. A Letter has no cursor: one dead letter is found by
// its job id (PageOptions.ID).
func (b *brokerQueue) Page(ctx context.Context, o queue.PageOptions) (queue.DLQPage, error) {
	fail := func(err error) error { return fmt.Errorf("queue %s: page: %w", b.q.name, err) }
	o, err := queue.CheckPage(o)
	if err != nil {
		return queue.DLQPage{}, fail(err)
	}
	looked, size := 0, -1
	if o.Cursor != "" {
		l, s, ok := strings.Cut(o.Cursor, "/")
		looked, err = strconv.Atoi(l)
		size, err2 := strconv.Atoi(s)
		if !ok || err != nil || err2 != nil || looked < 0 || size < looked {
			return queue.DLQPage{}, fail(fmt.Errorf("cursor must be looked/size (0 <= looked <= size), got %q", o.Cursor))
		}
		return b.page(ctx, o, looked, size, fail)
	}
	return b.page(ctx, o, looked, size, fail)
}

func (b *brokerQueue) page(ctx context.Context, o queue.PageOptions, looked, size int, fail func(error) error) (queue.DLQPage, error) {
	conn, err := b.q.adminConn(ctx, "page")
	if err != nil {
		return queue.DLQPage{}, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return queue.DLQPage{}, fail(err)
	}
	defer ch.Close() // returns whatever was not put back
	if err := ch.Confirm(false); err != nil {
		return queue.DLQPage{}, fail(err)
	}
	dlq := NamesFor(b.q.name).DLQ
	var seen []amqp.Delivery
	page := queue.DLQPage{}
	for len(page.Letters) < o.Limit && page.Scanned < o.Scan && (size < 0 || looked+page.Scanned < size) {
		if err := ctx.Err(); err != nil {
			return page, fail(err)
		}
		d, ok, err := ch.Get(dlq, false)
		if err != nil {
			return page, fail(err)
		}
		if !ok {
			size = looked + page.Scanned // the DLQ ran out
			break
		}
		if size < 0 {
			size = int(d.MessageCount) + 1 // those behind it, and it
		}
		seen = append(seen, d)
		page.Scanned++
		if l := letterOf(d, o.Preview); o.Match(l) {
			page.Letters = append(page.Letters, l)
		}
	}
	if err := toTail(ctx, ch, dlq, seen); err != nil {
		return page, fail(err)
	}
	if looked += page.Scanned; size > looked {
		page.Next = strconv.Itoa(looked) + "/" + strconv.Itoa(size)
	}
	return page, nil
}

// letterOf reads dead letter d.
func letterOf(d amqp.Delivery, preview int) queue.Letter {
	dl := deadLetterOf(d)
	l := queue.Letter{JobID: dl.JobID, Type: dl.JobType, Attempt: dl.Attempt,
		Reason: dl.Reason, Error: dl.Error, Payload: queue.Cut(d.Body, preview), PayloadSize: len(d.Body), Fields: dl.Headers}
	if dl.DeadLetteredMs > 0 {
		l.DeadLettered = time.UnixMilli(dl.DeadLetteredMs)
	}
	return l
}

// Audit reads the whole of Q.audit (at most AuditMaxLength records, its
// x-max-length) and puts each record back at the tail in order, so that
// the queue's order is kept, and returns the newest limit. A queue with no
// audit yet (nothing discarded) has no records.
func (b *brokerQueue) Audit(ctx context.Context, limit int) ([]queue.AuditRecord, error) {
	fail := func(err error) error { return fmt.Errorf("queue %s: audit: %w", b.q.name, err) }
	if limit < 1 || limit > queue.MaxAuditRead {
		return nil, fail(fmt.Errorf("limit must be in 1..%d, got %d", queue.MaxAuditRead, limit))
	}
	conn, err := b.q.adminConn(ctx, "audit")
	if err != nil {
		return nil, err
	}
	name := NamesFor(b.q.name).Audit
	if !queueExists(conn, name) {
		return nil, nil
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, fail(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return nil, fail(err)
	}
	var seen []amqp.Delivery
	for size := AuditMaxLength; len(seen) < size; {
		d, ok, err := ch.Get(name, false)
		if err != nil {
			return nil, fail(err)
		}
		if !ok {
			break
		}
		if len(seen) == 0 {
			size = min(size, int(d.MessageCount)+1)
		}
		seen = append(seen, d)
	}
	if err := toTail(ctx, ch, name, seen); err != nil {
		return nil, fail(err)
	}
	out := make([]queue.AuditRecord, 0, min(limit, len(seen)))
	for i := len(seen) - 1; i >= 0 && len(out) < limit; i-- {
		h := seen[i].Headers
		r := queue.AuditRecord{Action: queue.DiscardAction(headerString(h, HeaderAuditAction)), Note: headerString(h, HeaderAuditNote),
			Actor: headerString(h, HeaderAuditActor), JobID: seen[i].MessageId, Reason: deadLetterReason(h)}
		if ms, _, ok := headerDigits(h[HeaderAuditAtMs]); ok {
			r.At = time.UnixMilli(ms)
		}
		out = append(out, r)
	}
	return out, nil
}
