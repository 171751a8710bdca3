package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/backstop-dev/backstop/queue"
)

// Force run (README, "Run a delayed job now"): a delayed job waits in a
// shared delay level, ready (nobody holds it) or held by a worker's mover.
// Run takes the ready ones itself (basic.get, bounded) and asks the movers
// for the held ones (the run exchange); both publish the job to its work
// queue with a confirm, its attempt kept and its due time dropped, and
// only then ack it: a crash in between leaves it in its level too (a
// duplicate, as every move), never in neither.

// RunExchange is the fanout exchange every mover binds a queue of its own
// to, where Run asks the movers for the delayed jobs they hold.
const RunExchange = "backstop.run"

// The headers of Run's commands to the movers and of their answers.
const (
	headerRunOp        = "backstop-run-op" // "count" (every mover) or "take" (one mover)
	headerRunQueue     = "backstop-run-queue"
	headerRunID        = "backstop-run-id"
	headerRunBeforeMs  = "backstop-run-due-before-ms"
	headerRunLimit     = "backstop-run-limit"
	headerRunMatched   = "backstop-run-matched"
	headerRunMoved     = "backstop-run-moved"
	headerRunMoverName = "backstop-run-mover" // the mover's command queue: where a take goes
)

// runWait is how long Run waits for a mover's answer: a mover answers
// from memory, at once; one that does not (a worker of a backstop from
// before issue 45, whose mover takes no commands) is reported, not waited
// for.
var runWait = 5 * time.Second

// RunOptions select the delayed jobs Run moves: ID, or DueBefore with
// Limit (1..queue.MaxRunLimit).
type RunOptions struct {
	ID        string
	DueBefore time.Time
	Limit     int
	// Actor is who runs them (at most 256 bytes): when set, the run is
	// recorded in the audit queue Q.audit (action run): one record per
	// job taken from a delay level, by job id, and one per mover's take of
	// the jobs it held (by job id for a run by id; else its note says how
	// many), each before the Run returns.
	Actor string
}

// Ran is what Run did.
type Ran struct {
	// Moved counts the jobs published to the work queue.
	Moved int
	// Left counts the jobs seen due before DueBefore beyond the limit.
	Left int
	// Silent counts the movers that did not answer within 5 s: the jobs
	// they hold were not looked at.
	Silent int
}

// ErrSilentMovers is wrapped by Run's error when some movers did not
// answer: what they hold was not looked at (Ran says what moved).
var ErrSilentMovers = errors.New("movers did not answer")

// Run moves delayed jobs of the queue to the queue now, whatever their due
// time (Cloud Tasks' RunTask): the one with job id o.ID (every copy of it),
// or at most o.Limit of those due at or before o.DueBefore, each level's
// and each mover's earliest first. It looks at most at 100,000 ready
// messages of the shared levels, and at everything the movers hold.
//
// # Errors
//
// Options that select nothing or two things, a limit out of range; a queue
// that does not exist (ErrNoQueue); ErrSilentMovers, with what moved.
func (q *Queue) Run(ctx context.Context, o RunOptions) (Ran, error) {
	fail := func(err error) error { return fmt.Errorf("queue %s: run: %w", q.name, err) }
	limit := o.Limit
	switch {
	case (o.ID == "") == o.DueBefore.IsZero():
		return Ran{}, fail(errors.New("give a job id or a due time bound, one of them"))
	case o.ID != "":
		if o.Limit != 0 {
			return Ran{}, fail(errors.New("a limit goes with a due time bound, not a job id"))
		}
		limit = maxScan
	case o.Limit < 1 || o.Limit > queue.MaxRunLimit:
		return Ran{}, fail(fmt.Errorf("limit must be in 1..%d, got %d", queue.MaxRunLimit, o.Limit))
	}
	if err := queue.CheckActor(o.Actor); err != nil {
		return Ran{}, fail(err)
	}
	conn, err := q.adminConn(ctx, "run")
	if err != nil {
		return Ran{}, err
	}
	if !queueExists(conn, q.name) {
		return Ran{}, fail(fmt.Errorf("%w: no queue %q in this virtual host", ErrNoQueue, q.name))
	}
	at := itoa(time.Now().UnixMilli())
	var audit func(amqp.Delivery) amqp.Publishing
	if o.Actor != "" {
		if err := declareAudit(conn, q.name); err != nil {
			return Ran{}, fail(err)
		}
		audit = func(d amqp.Delivery) amqp.Publishing {
			p := next(d, map[string]any{HeaderAuditAction: string(queue.AuditRun), HeaderAuditActor: o.Actor,
				HeaderAuditAtMs: at, HeaderReason: headerString(d.Headers, HeaderLastReason)}, true)
			p.Body = nil
			return p
		}
	}
	before := o.DueBefore.UnixMilli()
	match := func(h amqp.Table, id string) bool {
		return headerString(h, HeaderDestination) == q.name &&
			(o.ID != "" && id == o.ID || o.ID == "" && dueMs(h) <= before)
	}
	var r Ran
	// The ready messages of the levels, then the movers' holds.
	scan := maxScan
	for _, level := range levelQueues() {
		if scan == 0 {
			break
		}
		if !queueExists(conn, level) {
			continue
		}
		seen := 0
		m := mover{
			limit: max(limit-r.Moved, 0), scan: scan, what: "run", left: &r.Left,
			audit: audit, auditQueue: NamesFor(q.name).Audit,
			match: func(d amqp.Delivery) bool { seen++; return match(d.Headers, d.MessageId) },
			publishing: func(d amqp.Delivery) (string, amqp.Publishing, error) {
				return q.name, runPublishing(d), nil
			},
		}
		n, err := m.run(ctx, conn, level)
		r.Moved += n
		scan -= seen
		if err != nil {
			return r, fail(err)
		}
	}
	moved, left, silent, err := runHeld(ctx, conn, q.name, o, max(limit-r.Moved, 0))
	r.Moved, r.Left, r.Silent = r.Moved+moved, r.Left+left, silent
	if err == nil && moved > 0 && o.Actor != "" {
		err = auditHeldRun(ctx, conn, q.name, o, at, moved)
	}
	if err != nil {
		return r, fail(err)
	}
	if silent > 0 {
		return r, fail(fmt.Errorf("%w: %d movers did not answer within %v, the delayed jobs they hold were not looked at (moved %d); a worker of a backstop from before issue 45 takes no run commands",
			ErrSilentMovers, silent, runWait, r.Moved))
	}
	return r, nil
}

// auditHeldRun records in Q.audit, with a confirm, what the movers moved
// for a run: the movers are other processes (in any language), which
// answer how many they moved, not which; so a run by id records that id
// once per job moved, a run by due time one record whose note says how
// many.
func auditHeldRun(ctx context.Context, conn *amqp.Connection, name string, o RunOptions, at string, moved int) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return err
	}
	h := amqp.Table{HeaderAuditAction: string(queue.AuditRun), HeaderAuditActor: o.Actor, HeaderAuditAtMs: at}
	records := []amqp.Publishing{}
	if o.ID != "" {
		h[HeaderAuditNote] = "held by a worker's mover"
		for range moved {
			records = append(records, amqp.Publishing{Headers: h, MessageId: o.ID})
		}
	} else {
		h[HeaderAuditNote] = itoa(int64(moved)) + " jobs held by the workers' movers, due before " + o.DueBefore.UTC().Format(time.RFC3339)
		records = append(records, amqp.Publishing{Headers: h})
	}
	for _, p := range records {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", NamesFor(name).Audit, false, false, p)
		if err != nil {
			return fmt.Errorf("audit the run: %w", err)
		}
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			return fmt.Errorf("audit the run: the broker refused (nack) its record: %v", err)
		}
	}
	return nil
}

// levelQueues are the queues a delayed message can wait in: the hold
// levels, then the first topology's TTL levels.
func levelQueues() []string {
	var out []string
	for n := range holdLevels {
		out = append(out, holdQueue+strconv.Itoa(n))
	}
	for n := range delayBits {
		out = append(out, delayExchange+strconv.Itoa(n))
	}
	return out
}

// runPublishing is the message a run publishes for delayed message d: the
// job as it is (attempt, first-enqueued time, last error kept) without its
// due time, which would have the worker delay it again.
func runPublishing(d amqp.Delivery) amqp.Publishing {
	return next(d, map[string]any{HeaderDueMs: nil, HeaderMoveRefusals: nil}, true)
}

// runHeld asks the movers for the delayed jobs of queue name they hold:
// every mover counts its matches (RunExchange), then the movers with
// matches move them in turn, each at most what is left of limit (a
// command to its own queue), so that the limit holds across movers.
func runHeld(ctx context.Context, conn *amqp.Connection, name string, o RunOptions, limit int) (moved, left, silent int, err error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, 0, 0, err
	}
	defer ch.Close()
	if err := ch.ExchangeDeclare(RunExchange, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
		return 0, 0, 0, err
	}
	// Every mover consumes hold.L0 once.
	movers := 0
	if queueExists(conn, holdQueue+"0") {
		st, err := ch.QueueDeclarePassive(holdQueue+"0", true, false, false, false, nil)
		if err != nil {
			return 0, 0, 0, err
		}
		movers = st.Consumers
	}
	if movers == 0 {
		return 0, 0, 0, nil
	}
	replies, err := ch.Consume("amq.rabbitmq.reply-to", "", true, false, false, false, nil)
	if err != nil {
		return 0, 0, 0, err
	}
	cmd := amqp.Table{headerRunQueue: name}
	if o.ID != "" {
		cmd[headerRunID] = o.ID
	} else {
		cmd[headerRunBeforeMs] = itoa(o.DueBefore.UnixMilli())
	}
	ask := func(exchange, key, op, corr string, n int) error {
		h := copyHeaders(cmd)
		h[headerRunOp], h[headerRunLimit] = op, itoa(int64(n))
		return ch.PublishWithContext(ctx, exchange, key, false, false,
			amqp.Publishing{Headers: h, ReplyTo: "amq.rabbitmq.reply-to", CorrelationId: corr})
	}
	// answer waits for the reply correlated with corr (until runWait).
	answer := func(corr string, timer <-chan time.Time) (amqp.Delivery, bool, error) {
		for {
			select {
			case d, ok := <-replies:
				if !ok {
					return d, false, amqp.ErrClosed
				}
				if d.CorrelationId == corr {
					return d, true, nil
				}
			case <-timer:
				return amqp.Delivery{}, false, nil
			case <-ctx.Done():
				return amqp.Delivery{}, false, ctx.Err()
			}
		}
	}
	if err := ask(RunExchange, "", "count", "count", 0); err != nil {
		return 0, 0, 0, err
	}
	type counted struct {
		queue   string
		matched int
	}
	var found []counted
	timer := time.NewTimer(runWait)
	defer timer.Stop()
	for range movers {
		d, ok, err := answer("count", timer.C)
		if err != nil {
			return 0, 0, 0, err
		}
		if !ok {
			break
		}
		n, _, _ := headerDigits(d.Headers[headerRunMatched])
		found = append(found, counted{headerString(d.Headers, headerRunMoverName), int(n)})
	}
	silent = movers - len(found)
	slices.SortFunc(found, func(a, b counted) int { return b.matched - a.matched })
	for i, f := range found {
		if f.matched == 0 {
			continue
		}
		if moved >= limit {
			left += f.matched
			continue
		}
		corr := "take-" + strconv.Itoa(i)
		if err := ask("", f.queue, "take", corr, limit-moved); err != nil {
			return moved, left, silent, err
		}
		t := time.NewTimer(runWait)
		d, ok, err := answer(corr, t.C)
		t.Stop()
		if err != nil {
			return moved, left, silent, err
		}
		if !ok {
			silent++
			continue
		}
		n, _, _ := headerDigits(d.Headers[headerRunMoved])
		m, _, _ := headerDigits(d.Headers[headerRunMatched])
		moved += int(n)
		left += max(int(m-n), 0)
	}
	return moved, left, silent, nil
}

// Run moves delayed jobs now (Queue.Run).
func (b *brokerQueue) Run(ctx context.Context, o queue.RunOptions) (queue.RunResult, error) {
	r, err := b.q.Run(ctx, RunOptions{ID: o.ID, DueBefore: o.DueBefore, Limit: o.Limit, Actor: o.Actor})
	return queue.RunResult{Moved: r.Moved, Left: r.Left}, err
}
