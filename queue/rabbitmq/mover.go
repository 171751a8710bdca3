package rabbitmq

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/backstop-dev/backstop/internal/ctxtime"
)

// The mover moves delayed messages down the levels (README, "The moves
// between levels are the workers', not the broker's"): it holds each
// delivery of hold.L<n> until its time, publishes it unchanged to the next
// exchange with a confirm, and only then acks it. Every Work runs one.

// movePrefetch is how many deliveries a mover holds per level at once.
const movePrefetch = 1000

// moveRetry is the pause before a move the broker refused is tried again.
const moveRetry = 10 * time.Second

// move runs the mover for q's broker until ctx is done, on channels of its
// own, consuming again after a lost channel.
func (q *Queue) move(ctx context.Context) {
	pause := 50 * time.Millisecond
	for {
		err := q.moveSession(ctx)
		if ctx.Err() != nil || errors.Is(err, ErrClosed) {
			return
		}
		q.b.cfg.log.Warn("rabbitmq delay mover lost its channel; consuming again", "err", err)
		if !ctxtime.Sleep(ctx, pause) {
			return
		}
		pause = min(2*pause, 2*time.Second)
	}
}

// held is a delivery of level n, waiting for its time.
type held struct {
	n int
	d amqp.Delivery
}

func (q *Queue) moveSession(ctx context.Context) error {
	if err := q.ensure(ctx); err != nil { // the hold queues, once per connection
		return err
	}
	ch, _, err := q.b.channel(ctx)
	if err != nil {
		return err
	}
	lost := ch.NotifyClose(make(chan *amqp.Error, 1))
	// A move publishes with mandatory: the broker returns one it cannot
	// route (its work queue is gone) before it confirms it, and the move
	// is then tried again instead of acked (lost).
	returns := ch.NotifyReturn(make(chan amqp.Return, 16))
	sctx, cancel := context.WithCancel(ctx)
	due := make(chan held, movePrefetch)
	var (
		mu        sync.Mutex
		pending   = map[*time.Timer]struct{}{}
		timers    sync.WaitGroup // holds not handed over
		consumers sync.WaitGroup
	)
	defer func() {
		cancel()
		mu.Lock()
		for t := range pending {
			if t.Stop() {
				timers.Done()
			}
		}
		mu.Unlock()
		ch.Close() // the deliveries still held go back to their levels
		consumers.Wait()
		timers.Wait()
	}()
	// hold waits until at (a timer, not a goroutine: a mover holds up to
	// holdLevels × movePrefetch deliveries), then hands h to the loop
	// below; a session that ends first drops it, and the broker gives it
	// back to its level.
	hold := func(h held, at time.Time) {
		mu.Lock()
		defer mu.Unlock()
		if sctx.Err() != nil {
			return
		}
		timers.Add(1)
		var t *time.Timer
		t = time.AfterFunc(time.Until(at), func() {
			defer timers.Done()
			mu.Lock()
			delete(pending, t)
			mu.Unlock()
			select {
			case due <- h:
			case <-sctx.Done():
			}
		})
		pending[t] = struct{}{}
	}
	if err := ch.Qos(movePrefetch, 0, false); err != nil {
		return err
	}
	for n := range holdLevels {
		deliveries, err := ch.Consume(holdQueue+strconv.Itoa(n), "", false, false, false, false, nil)
		if err != nil {
			return err
		}
		consumers.Add(1)
		go func() {
			defer consumers.Done()
			for d := range deliveries {
				hold(held{n, d}, releaseAt(n, d.RoutingKey, d.Headers, time.Now()))
			}
		}()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-lost:
			if err == nil {
				return amqp.ErrClosed
			}
			return err
		case h := <-due:
			// One at a time: a level's moves are few per second, and a
			// confirm is a round trip on loopback.
			if err := moveOne(sctx, ch, h, returns); err != nil {
				if ch.IsClosed() {
					continue // lost: the next loop turn returns
				}
				q.b.cfg.log.Warn("rabbitmq delay move refused; trying again", "level", h.n, "job", h.d.MessageId, "in", moveRetry, "err", err)
				hold(h, time.Now().Add(moveRetry))
			}
		}
	}
}

// errUnroutable is a move the broker returned: no queue is bound for it.
var errUnroutable = errors.New("rabbitmq: no route for the delayed message (its work queue was deleted?)")

// moveOne publishes h to its next exchange, waits for the confirm and acks
// it; a move the broker returned (returns) is not acked. The moves of a
// channel are one at a time, so a return seen before the confirm is this
// move's: the client reads a return before the confirm that follows it.
func moveOne(ctx context.Context, ch *amqp.Channel, h held, returns <-chan amqp.Return) error {
	d := h.d
	next := deliverXchg
	if h.n > 0 {
		next = delayExchange + strconv.Itoa(h.n-1)
	}
	for drained := false; !drained; { // a timed-out move's late return
		select {
		case <-returns:
		default:
			drained = true
		}
	}
	headers := copyHeaders(d.Headers)
	// The hold queue's own count of redeliveries: the work queue's worker
	// reads x-delivery-count as its own (crash loops).
	delete(headers, "x-delivery-count")
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	dc, err := ch.PublishWithDeferredConfirmWithContext(pctx, next, d.RoutingKey, true, false, amqp.Publishing{
		Headers: headers, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding,
		DeliveryMode: amqp.Persistent, Priority: d.Priority, CorrelationId: d.CorrelationId, ReplyTo: d.ReplyTo,
		MessageId: d.MessageId, Timestamp: d.Timestamp, Type: d.Type, AppId: d.AppId, Body: d.Body,
	})
	if err != nil {
		return err
	}
	if err := waitConfirm(pctx, ch, dc); err != nil {
		return err
	}
	select {
	case _, returned := <-returns: // closed with the channel: not a return
		if returned {
			return errUnroutable
		}
	default:
	}
	return d.Ack(false)
}

// releaseAt is when a delivery of hold.L<n> received at now leaves its
// level: 2^n s after it was received, or earlier when its due time says
// it entered the level before (it waited there for a mover): its due time
// less the delay still to go below n, the routing key's lower bits. A
// routing key that is not the 18 words (not written by backstop) goes by
// the receipt alone.
func releaseAt(n int, key string, h amqp.Table, now time.Time) time.Time {
	at := now.Add(time.Duration(1<<n) * time.Second)
	due := dueMs(h)
	words := strings.Split(key, ".")
	if due <= 0 || len(words) != delayBits {
		return at
	}
	var low int64
	for bit := range n {
		switch words[delayBits-1-bit] {
		case "1":
			low += 1 << bit
		case "0":
		default:
			return at
		}
	}
	if byDue := time.UnixMilli(due - low*1000); byDue.Before(at) {
		return byDue
	}
	return at
}
