package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
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

// moveLanes is how many moves a mover makes at once, each lane one at a
// time on a publishing channel of its own: a lane's move waits for its
// confirm (and its dead letter's, for an unroutable one), so one lane made
// a burst of moves wait behind each other (1200 unroutable moves delayed
// another queue's moves by over a second).
const moveLanes = 4

// moveRetry is the pause before a move the broker refused is tried again,
// and the delay a refused move re-enters the levels for; maxMoveRefusals
// is the refusal at which it is dead-lettered (unroutable).
const (
	moveRetry       = 10 * time.Second
	maxMoveRefusals = 30
)

// moveGrace is how long a pending confirm is awaited once the mover stops.
const moveGrace = 10 * time.Second

// UnroutableQueue is the shared quorum queue where a delayed message goes
// when neither its work queue nor that queue's DLQ exists (README, "The
// moves between levels are the workers'"); declared with the levels.
const UnroutableQueue = "backstop.unroutable"

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
	sctx, cancel := context.WithCancel(ctx)
	// Confirms are awaited while ch lives, and moveGrace after ctx is done.
	grace, stopGrace := afterGrace(ctx, moveGrace)
	defer stopGrace()
	due := make(chan held, movePrefetch)
	var (
		mu        sync.Mutex
		pending   = map[*time.Timer]held{}
		timers    sync.WaitGroup // holds not handed over
		consumers sync.WaitGroup
		lanes     sync.WaitGroup
		laneChs   []*amqp.Channel
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
		lanes.Wait() // their moves in hand: confirmed, or given up after moveGrace
		for _, lch := range laneChs {
			lch.Close()
		}
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
		pending[t] = h
	}
	// The lanes: each publishes one move at a time, with mandatory: the
	// broker returns one it cannot route (its work queue is gone) before it
	// confirms it, so a return seen before the confirm is that move's, and
	// it is then dead-lettered (unroutable) instead of acked (lost).
	laneLost := make(chan error, moveLanes)
	for range moveLanes {
		lch, _, err := q.b.channel(ctx)
		if err != nil {
			return err
		}
		laneChs = append(laneChs, lch)
		returns := lch.NotifyReturn(make(chan amqp.Return, 16))
		lanes.Add(1)
		go func() {
			defer lanes.Done()
			for {
				var h held
				select {
				case <-sctx.Done():
					return
				case h = <-due:
				}
				err := moveOne(grace, lch, h, returns, q.b.cfg.log)
				if err == nil {
					continue
				}
				if lch.IsClosed() || ctx.Err() != nil {
					laneLost <- err // the session ends; h goes back to its level
					return
				}
				q.b.cfg.log.Warn("rabbitmq delay move refused; trying again", "level", h.n, "job", h.d.MessageId, "in", moveRetry, "err", err)
				hold(h, time.Now().Add(moveRetry))
			}
		}()
	}
	if err := ch.Qos(movePrefetch, 0, false); err != nil {
		return err
	}
	// Run's commands (run.go): a queue of this session's own, bound to
	// the run exchange, answered from the holds.
	cq, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		return err
	}
	if err := ch.QueueBind(cq.Name, "", RunExchange, false, nil); err != nil {
		return err
	}
	cmds, err := ch.Consume(cq.Name, "", true, true, false, false, nil)
	if err != nil {
		return err
	}
	rch, _, err := q.b.channel(ctx)
	if err != nil {
		return err
	}
	laneChs = append(laneChs, rch)
	rreturns := rch.NotifyReturn(make(chan amqp.Return, 16))
	// take stops the holds of the deliveries a command selects, earliest
	// due first, at most limit of them (count: none), and returns them and
	// how many matched.
	take := func(c amqp.Delivery, limit int) ([]held, int) {
		dest, id := headerString(c.Headers, headerRunQueue), headerString(c.Headers, headerRunID)
		before, _, byTime := headerDigits(c.Headers[headerRunBeforeMs])
		mu.Lock()
		defer mu.Unlock()
		type sel struct {
			t *time.Timer
			h held
		}
		var all []sel
		for t, h := range pending {
			if headerString(h.d.Headers, HeaderDestination) == dest &&
				(id != "" && h.d.MessageId == id || id == "" && byTime && dueMs(h.d.Headers) <= before) {
				all = append(all, sel{t, h})
			}
		}
		slices.SortFunc(all, func(a, b sel) int { return int(dueMs(a.h.d.Headers) - dueMs(b.h.d.Headers)) })
		var out []held
		for _, s := range all {
			if len(out) == limit {
				break
			}
			if s.t.Stop() { // else its time came: the move has it
				delete(pending, s.t)
				timers.Done()
				out = append(out, s.h)
			}
		}
		return out, len(all)
	}
	consumers.Add(1)
	go func() {
		defer consumers.Done()
		for c := range cmds {
			limit := 0
			if headerString(c.Headers, headerRunOp) == "take" {
				n, _, _ := headerDigits(c.Headers[headerRunLimit])
				limit = int(n)
			}
			hs, matched := take(c, limit)
			moved := 0
			for _, h := range hs {
				// As a move (moveOne), to the work queue: published with a
				// confirm, then acked; one the broker does not take goes on
				// down the levels, due now.
				err := publishMandatory(grace, rch, rreturns, "", headerString(h.d.Headers, HeaderDestination), runPublishing(h.d))
				if err == nil {
					err = h.d.Ack(false)
				}
				if err != nil {
					q.b.cfg.log.Warn("rabbitmq run of a held delayed job failed; it goes on delayed", "job", h.d.MessageId, "err", err)
					hold(h, time.Now())
					continue
				}
				moved++
			}
			if c.ReplyTo == "" {
				continue
			}
			err := ch.PublishWithContext(sctx, "", c.ReplyTo, false, false, amqp.Publishing{CorrelationId: c.CorrelationId,
				Headers: amqp.Table{headerRunMatched: itoa(int64(matched)), headerRunMoved: itoa(int64(moved)), headerRunMoverName: cq.Name}})
			if err != nil {
				q.b.cfg.log.Warn("rabbitmq run: cannot answer", "err", err)
			}
		}
	}()
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
		case err := <-laneLost:
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
}

// errUnroutable is a publish the broker returned: no queue is bound for it.
var errUnroutable = errors.New("rabbitmq: no route for the message")

// moveOne moves h to its next exchange and acks it (README, "The moves
// between levels are the workers'"): a move the broker returns is
// dead-lettered (unroutable), one it refuses re-enters the delay for
// moveRetry (dead-lettered at its maxMoveRefusals-th refusal); then h is
// acked. The error says h is to be held and tried again (its re-entry or
// dead letter was refused too), or the channel was lost.
func moveOne(ctx context.Context, ch *amqp.Channel, h held, returns <-chan amqp.Return, log *slog.Logger) error {
	d := h.d
	to := deliverXchg
	if h.n > 0 {
		to = delayExchange + strconv.Itoa(h.n-1)
	}
	// Unchanged, but x-delivery-count (the hold queue's own count: the work
	// queue's worker would read it as its own), within the bounds.
	err := publishMandatory(ctx, ch, returns, to, d.RoutingKey, next(d, nil, false))
	switch {
	case errors.Is(err, errUnroutable):
		dest := headerString(d.Headers, HeaderDestination)
		why := "no route for a delayed message without backstop-destination"
		if dest != "" {
			why = fmt.Sprintf("no route to queue %q: it was deleted or never declared", dest)
		}
		log.Warn("rabbitmq delayed message unroutable; dead-lettered", "job", d.MessageId, "queue", dest)
		err = deadLetterMove(ctx, ch, returns, d, why)
	case errors.Is(err, ErrRejected):
		log.Warn("rabbitmq delay move refused; delayed again", "level", h.n, "job", d.MessageId,
			"queue", headerString(d.Headers, HeaderDestination), "in", moveRetry, "err", err)
		err = reenter(ctx, ch, returns, d, err)
	}
	if err != nil {
		return err
	}
	return d.Ack(false)
}

// reenter publishes d, whose move the broker refused, to the delay again for
// moveRetry (or the rest of its own due time, if later), counting the
// refusal; at maxMoveRefusals it dead-letters it (unroutable) instead.
func reenter(ctx context.Context, ch *amqp.Channel, returns <-chan amqp.Return, d amqp.Delivery, refused error) error {
	n, _, _ := headerDigits(d.Headers[HeaderMoveRefusals])
	if n++; n >= maxMoveRefusals {
		return deadLetterMove(ctx, ch, returns, d, fmt.Sprintf(
			"the broker refused the delayed message's move %d times (a full queue or delay level): %v", n, refused))
	}
	now := time.Now().UnixMilli()
	due := max(dueMs(d.Headers), now+moveRetry.Milliseconds())
	msg := next(d, map[string]any{HeaderDueMs: itoa(due), HeaderMoveRefusals: itoa(n)}, false)
	key := delayRoutingKey(delaySeconds(time.Duration(due-now) * time.Millisecond))
	return publishMandatory(ctx, ch, returns, enterXchg, key, msg)
}

// deadLetterMove dead-letters d, a delayed message that cannot be moved,
// with reason unroutable and error why: to its work queue's DLQ, or when
// that is gone too or it names no work queue, to UnroutableQueue.
func deadLetterMove(ctx context.Context, ch *amqp.Channel, returns <-chan amqp.Return, d amqp.Delivery, why string) error {
	msg := next(d, map[string]any{HeaderReason: "unroutable", HeaderError: why,
		HeaderDeadLetteredMs: itoa(time.Now().UnixMilli()), HeaderMoveRefusals: nil}, true)
	err := errUnroutable
	if dest := headerString(d.Headers, HeaderDestination); dest != "" {
		err = publishMandatory(ctx, ch, returns, "", NamesFor(dest).DLQ, msg)
	}
	if errors.Is(err, errUnroutable) {
		err = publishMandatory(ctx, ch, returns, "", UnroutableQueue, msg)
	}
	return err
}

// publishMandatory publishes msg with mandatory on ch and waits for its
// confirm, with no timeout of its own while ch lives (until ctx is done):
// errUnroutable when the broker returned it, ErrRejected for a negative
// confirm, amqp.ErrClosed when ch went first. The publishes of a channel
// are one at a time, so a return seen before the confirm is this
// message's: the client reads a return before the confirm that follows it.
func publishMandatory(ctx context.Context, ch *amqp.Channel, returns <-chan amqp.Return, exchange, key string, msg amqp.Publishing) error {
	for drained := false; !drained; { // a late return of a move given up at shutdown
		select {
		case <-returns:
		default:
			drained = true
		}
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, msg)
	if err != nil {
		return err
	}
	if err := waitConfirm(ctx, ch, dc); err != nil {
		return err
	}
	select {
	case _, returned := <-returns: // closed with the channel: not a return
		if returned {
			return errUnroutable
		}
	default:
	}
	return nil
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
