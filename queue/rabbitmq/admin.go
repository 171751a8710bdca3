package rabbitmq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/backstop-dev/backstop/internal/redact"
	"github.com/backstop-dev/backstop/queue"
)

// maxScan bounds what Replay and Inspect look at in one call: each message
// looked at is held unacked (in this process and in the broker) until the
// call ends, so that it is not read twice.
const maxScan = 100_000

// replayBatch is how many replays are published before their confirms are
// awaited and their dead letters acked. Below RabbitMQ's
// quorum_commands_soft_limit (32): a channel holds back its settlements
// to a quorum queue beyond it, and drops them if it closes first (seen in
// 3.10: a replayed dead letter left in the DLQ too). The next batch's
// basic.gets, synchronous commands on the same queue, let each batch's
// acks be applied before the next.
const replayBatch = 16

// ReplayOptions bounds a Replay.
type ReplayOptions struct {
	// Limit is the most dead letters moved: required, at least 1.
	Limit int
	// Reason moves only dead letters with this reason ("" = any). A message
	// the broker dead-lettered for its delivery limit has reason crash_loop.
	Reason string
	// JobType moves only dead letters of this job type
	// (backstop-job-type; "" = any).
	JobType string
	// KeepAttempts keeps the job's attempt and first-enqueued time. By
	// default a replayed job starts afresh (attempt 1, a new time budget),
	// as after a fix.
	KeepAttempts bool
	// Scan is the most dead letters looked at, so that a filtered replay
	// stays bounded: default 10 × Limit, at most 100,000 (or Limit, when
	// larger).
	Scan int
	// ID moves only the dead letters of this job id (message_id; "" = any).
	ID string
	// Rate paces the replay: at most Rate dead letters a second on average,
	// in batches of at most 16 (queue.Pacer); 0 = unpaced.
	Rate float64
	// Actor is who replays (at most 256 bytes): when set, each dead letter
	// replayed is recorded in the audit queue Q.audit (action replay, the
	// actor, at-ms, its job id, reason and headers, no body), as Discard
	// records its own; "" records nothing.
	Actor string
}

// DeadLetter is one message of the dead letter queue, as Inspect shows it.
type DeadLetter struct {
	JobID           string `json:"job_id"`
	Attempt         string `json:"attempt"` // as the header holds it: a malformed one shows
	Reason          string `json:"reason"`  // crash_loop for a broker dead-letter (delivery limit)
	Error           string `json:"error"`
	JobType         string `json:"job_type,omitempty"`
	FirstEnqueuedMs int64  `json:"first_enqueued_ms,omitempty"` // 0: unknown
	DeadLetteredMs  int64  `json:"dead_lettered_ms,omitempty"`  // 0: unknown
	// Payload is the start of the body (at most 64 bytes, valid UTF-8 up
	// to a cut); PayloadSize its length.
	Payload     string            `json:"payload"`
	PayloadSize int               `json:"payload_size"`
	Headers     map[string]string `json:"headers"`
}

// Stats is a queue's state as the broker reports it.
type Stats struct {
	Ready     int64 `json:"ready"`     // messages of Q ready for a worker
	Consumers int64 `json:"consumers"` // workers consuming Q
	DLQ       int64 `json:"dlq"`       // messages in Q.dlq
	// DelayLevels is how many messages wait in the shared delay levels
	// (backstop.hold.L0..L10 and the first topology's backstop.delay.L0..L17),
	// for every queue of the virtual host: the levels are shared, so the
	// delayed messages of one queue cannot be counted apart (README,
	// "Counters and metrics"). The messages a worker's mover holds are
	// unacked: counted with WithManagementAPI only.
	DelayLevels int64 `json:"delay_levels"`
	// Unacked (delivered to a worker, not yet acked) comes only from the
	// management API (WithManagementAPI); nil without it.
	Unacked *int64 `json:"unacked,omitempty"`
}

// StatsOption configures Stats.
type StatsOption func(*statsConfig)

type statsConfig struct {
	mgmtURL string
	client  *http.Client
}

// WithManagementAPI has Stats read Unacked from the management API at
// baseURL (http://user:password@host:15672; credentials from the URL,
// else guest). client nil uses a client with a 10 s timeout.
func WithManagementAPI(baseURL string, client *http.Client) StatsOption {
	return func(c *statsConfig) { c.mgmtURL, c.client = baseURL, client }
}

// Replay moves at most o.Limit dead letters of Q.dlq back to the queue they
// came from (README, "Replay"): to the default exchange with routing key
// backstop-destination (Q when missing), never through an exchange other
// consumers share. Each is published with a confirm and only then acked, so
// a crash in between leaves a duplicate, never a loss. Dead letters looked
// at and not moved (another reason, no job id) stay in the DLQ. It returns
// how many moved.
//
//	n, err := q.Replay(ctx, rabbitmq.ReplayOptions{Limit: 100, Reason: "transient"})
//
// # Errors
//
// A Limit below 1, a Reason that is not 1..128 printable ASCII characters
// without spaces, a Scan outside Limit..max(Limit, 100000); a destination
// queue that does not exist (that dead letter stays); the broker's.
func (q *Queue) Replay(ctx context.Context, o ReplayOptions) (int, error) {
	conn, err := q.adminConn(ctx, "replay")
	if err != nil {
		return 0, err
	}
	return replayDeadLetters(ctx, conn, q.name, o)
}

// Inspect returns the first n (oldest) dead letters of Q.dlq: a peek, every
// message stays in the DLQ, and looking does not use it up (a quorum
// queue's delivery limit: README, "The DLQ workflow"); the headers shown
// leave out x-delivery-count. n is at most 100,000.
func (q *Queue) Inspect(ctx context.Context, n int) ([]DeadLetter, error) {
	conn, err := q.adminConn(ctx, "inspect")
	if err != nil {
		return nil, err
	}
	return inspectDeadLetters(ctx, conn, q.name, n)
}

// Stats reads the queue's depths: ready and consumers of Q (a passive
// declare), the DLQ's depth, and with WithManagementAPI the unacked and
// delayed counts. It declares nothing: a misspelt name is an error
// (ErrNoQueue), not a new queue.
func (q *Queue) Stats(ctx context.Context, opts ...StatsOption) (Stats, error) {
	conn, err := q.adminConn(ctx, "stats")
	if err != nil {
		return Stats{}, err
	}
	return queueStats(ctx, conn, q.name, opts...)
}

func (q *Queue) adminConn(ctx context.Context, op string) (*amqp.Connection, error) {
	if err := q.validate(); err != nil {
		return nil, err
	}
	conn, _, err := q.b.connection(ctx)
	if err != nil {
		return nil, fmt.Errorf("queue %s: %s: %w", q.name, op, err)
	}
	return conn, nil
}

// replayDeadLetters is Queue.Replay over a connection.
func replayDeadLetters(ctx context.Context, conn *amqp.Connection, name string, o ReplayOptions) (int, error) {
	fail := func(err error) error { return fmt.Errorf("queue %s: replay: %w", name, err) }
	if o.Limit < 1 {
		return 0, fail(fmt.Errorf("limit must be at least 1, got %d", o.Limit))
	}
	if o.Reason != "" && !reasonOK(o.Reason) {
		return 0, fail(fmt.Errorf("reason must be \"\" (any) or 1..128 printable ASCII characters without spaces, got %q", o.Reason))
	}
	scan, err := scanOf(o.Limit, o.Scan)
	if err != nil {
		return 0, fail(err)
	}
	if o.Rate < 0 || math.IsNaN(o.Rate) || math.IsInf(o.Rate, 0) {
		return 0, fail(fmt.Errorf("rate must be a positive number of dead letters a second, got %v", o.Rate))
	}
	if err := queue.CheckActor(o.Actor); err != nil {
		return 0, fail(err)
	}
	var audit func(amqp.Delivery) amqp.Publishing
	if o.Actor != "" {
		if err := declareAudit(conn, name); err != nil {
			return 0, fail(err)
		}
		at := itoa(time.Now().UnixMilli())
		audit = func(d amqp.Delivery) amqp.Publishing {
			// The dead letter's headers and reason, not its payload: the
			// job itself is back in its queue.
			p := next(d, map[string]any{HeaderAuditAction: string(queue.AuditReplay), HeaderAuditActor: o.Actor,
				HeaderAuditAtMs: at, HeaderReason: deadLetterReason(d.Headers)}, true)
			p.Body = nil
			return p
		}
	}
	exists := map[string]bool{}
	m := mover{
		audit: audit, auditQueue: NamesFor(name).Audit,
		limit: o.Limit, scan: scan, rate: o.Rate,
		// A dead letter without a job id stays for a person: a replay
		// would give it a new identity.
		match: func(d amqp.Delivery) bool {
			return d.MessageId != "" && (o.Reason == "" || deadLetterReason(d.Headers) == o.Reason) &&
				(o.JobType == "" || headerString(d.Headers, HeaderJobType) == o.JobType) &&
				(o.ID == "" || d.MessageId == o.ID)
		},
		publishing: func(d amqp.Delivery) (string, amqp.Publishing, error) {
			dest := name
			if s := headerString(d.Headers, HeaderDestination); s != "" {
				dest = s
			}
			// The default exchange drops a message for a queue that does
			// not exist, and the confirm says nothing of it: check once.
			if _, ok := exists[dest]; !ok {
				exists[dest] = queueExists(conn, dest)
			}
			if !exists[dest] {
				return "", amqp.Publishing{}, fmt.Errorf("job %q: its queue %q (backstop-destination) does not exist", d.MessageId, dest)
			}
			return dest, replayed(d, deadLetterReason(d.Headers), dest, o.KeepAttempts, time.Now().UnixMilli()), nil
		},
		what: "replay",
	}
	n, err := m.run(ctx, conn, NamesFor(name).DLQ)
	if err != nil {
		return n, fail(err)
	}
	return n, nil
}

// scanOf is how many dead letters a call looks at: scan, or by default
// 10 × limit, within limit..max(limit, maxScan).
func scanOf(limit, scan int) (int, error) {
	most := max(limit, maxScan)
	if scan == 0 {
		scan = max(limit, min(maxScan, 10*min(limit, maxScan)))
	}
	if scan < limit || scan > most {
		return 0, fmt.Errorf("scan must be in %d..%d (limit..max(limit, %d)), got %d", limit, most, maxScan, scan)
	}
	return scan, nil
}

// mover takes dead letters from a DLQ with basic.get (at most scan), and
// publishes each one match takes (at most limit) where publishing says,
// with a confirm, then acks it; the others are held unacked and returned
// (nack, requeue) at the end, so they stay. A rate paces the publishes
// (queue.Pacer, in batches of at most replayBatch).
type mover struct {
	limit, scan int
	rate        float64
	match       func(amqp.Delivery) bool
	publishing  func(amqp.Delivery) (string, amqp.Publishing, error)
	what        string // for the nack error: "replay", "discard", "run"
	// left, when set, counts the matches seen beyond limit: the scan goes
	// on to scan (they are held and given back, as the others).
	left *int
	// audit, when set, is the record each moved one publishes to the
	// audit queue (NamesFor(from's queue).Audit) before its move.
	audit func(amqp.Delivery) amqp.Publishing
	// auditQueue is where audit records go.
	auditQueue string
}

func (m mover) run(ctx context.Context, conn *amqp.Connection, from string) (int, error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	// Closing the channel returns whatever is still unacked to the DLQ: a
	// failure midway loses nothing.
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return 0, err
	}
	type published struct {
		d     amqp.Delivery
		dc    *amqp.DeferredConfirmation
		audit *amqp.DeferredConfirmation // its audit record's, or nil
	}
	var (
		held    []amqp.Delivery // looked at, not moved: returned at the end
		batch   []published
		moved   int
		paced   int // published since the pacer's last wait
		refused error
	)
	p := queue.NewPacer(m.rate, replayBatch)
	defer p.Stop()
	if err := p.Wait(ctx); err != nil {
		return 0, err
	}
	// flush waits for the batch's confirms and only then acks the dead
	// letters: a crash in between leaves a duplicate, never a loss.
	flush := func() error {
		defer func() { batch = batch[:0] }()
		for _, pb := range batch {
			acked, err := pb.dc.WaitContext(ctx)
			if err != nil {
				return err
			}
			if !acked {
				held = append(held, pb.d)
				refused = fmt.Errorf("the broker refused (nack) the %s of job %q", m.what, pb.d.MessageId)
				continue
			}
			if err := pb.d.Ack(false); err != nil {
				return err
			}
			moved++
			if pb.audit != nil {
				ok, err := pb.audit.WaitContext(ctx)
				if err != nil {
					return err
				}
				if !ok {
					refused = fmt.Errorf("the broker refused (nack) the audit record of the %s of job %q", m.what, pb.d.MessageId)
				}
			}
		}
		return nil
	}
	for seen := 0; (moved+len(batch) < m.limit || m.left != nil) && seen < m.scan && refused == nil; seen++ {
		if err := ctx.Err(); err != nil {
			return moved, err
		}
		d, ok, err := ch.Get(from, false)
		if err != nil {
			return moved, err
		}
		if !ok {
			break
		}
		if !m.match(d) {
			held = append(held, d)
			continue
		}
		if moved+len(batch) >= m.limit { // counted only (m.left)
			*m.left++
			held = append(held, d)
			continue
		}
		if paced == p.Batch() && m.rate > 0 {
			// The batch's worth is out: confirmed and acked, then the
			// pacer's next tick.
			if err := flush(); err != nil {
				return moved, err
			}
			if err := p.Wait(ctx); err != nil {
				held = append(held, d)
				return moved, err
			}
			paced = 0
			if refused != nil {
				held = append(held, d)
				break
			}
		}
		dest, pub, err := m.publishing(d)
		if err != nil {
			held = append(held, d)
			refused = err
			break
		}
		// The audit record first: a crash in between leaves a record of
		// a move that did not happen (the dead letter stays), never a
		// move without its record.
		var adc *amqp.DeferredConfirmation
		if m.audit != nil {
			adc, err = ch.PublishWithDeferredConfirmWithContext(ctx, "", m.auditQueue, false, false, m.audit(d))
			if err != nil {
				return moved, err
			}
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", dest, false, false, pub)
		if err != nil {
			return moved, err
		}
		paced++
		batch = append(batch, published{d, dc, adc})
		if len(batch) == replayBatch {
			if err := flush(); err != nil {
				return moved, err
			}
		}
	}
	if err := flush(); err != nil {
		return moved, err
	}
	if err := giveBack(ctx, ch, from, held); err != nil {
		return moved, err
	}
	return moved, refused
}

// refreshAt is the x-delivery-count at which a dead letter looked at is
// given back as a fresh copy rather than returned (giveBack).
const refreshAt = 10

// giveBack returns dead letters looked at (by inspect, or a replay or
// discard that did not take them) to their queue on ch, in order, so that
// looking never uses them up (README, "The DLQ workflow"): RabbitMQ 3.10
// to 4.2 count every return in x-delivery-count (basic.nack, basic.reject,
// a closed channel alike: measured on 3.10.8), and 4.x quorum queues drop
// a message at a delivery limit of 20 by default. They are returned with
// basic.nack (requeue), the one 4.3 does not count; but when one of them
// has been delivered refreshAt times or more, each is instead published
// again to the queue, unchanged but for x-delivery-count (confirmed; ch
// must be in confirm mode), and then acked: the copies start at 0. A crash
// in between leaves a dead letter twice, never none.
func giveBack(ctx context.Context, ch *amqp.Channel, queueName string, ds []amqp.Delivery) error {
	refresh := false
	for _, d := range ds {
		if n, _, ok := headerDigits(d.Headers["x-delivery-count"]); ok && n >= refreshAt {
			refresh = true
		}
	}
	if !refresh {
		for _, d := range ds {
			if err := d.Nack(false, true); err != nil {
				return err
			}
		}
		return nil
	}
	return toTail(ctx, ch, queueName, ds)
}

// toTail publishes each of ds again to the queue, unchanged but for
// x-delivery-count (confirmed; ch in confirm mode), then acks it: the
// copies go to the tail, in order. A crash in between leaves a dead letter
// twice, never none.
func toTail(ctx context.Context, ch *amqp.Channel, queueName string, ds []amqp.Delivery) error {
	dcs := make([]*amqp.DeferredConfirmation, len(ds))
	for i, d := range ds {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queueName, false, false, next(d, nil, false))
		if err != nil {
			return err
		}
		dcs[i] = dc
	}
	for i, d := range ds {
		if err := waitConfirm(ctx, ch, dcs[i]); err != nil {
			return err // the originals come back when ch closes
		}
		if err := d.Ack(false); err != nil {
			return err
		}
	}
	return nil
}

// The audit queue's headers, before the dead letter's own: what was done
// (delete, purge), why (the operator's note), by whom, when (unix ms).
const (
	HeaderAuditAction = "backstop-audit-action"
	HeaderAuditNote   = "backstop-audit-note"
	HeaderAuditActor  = "backstop-audit-actor"
	HeaderAuditAtMs   = "backstop-audit-at-ms"
)

// AuditMaxLength is how many discarded dead letters Q.audit keeps: it is
// declared with x-max-length 10000 and x-overflow drop-head, the oldest
// records go first.
const AuditMaxLength = 10000

// DiscardOptions selects the dead letters Discard removes and says why.
type DiscardOptions struct {
	// Action is "delete" (ID required) or "purge".
	Action string
	// ID, Reason and JobType discard only the dead letters of this job id
	// (message_id), with this reason, of this job type ("" = any).
	ID, Reason, JobType string
	// Limit is the most discarded: 0 = every one that matches among Scan.
	Limit int
	// Scan is the most dead letters looked at: default (and at most)
	// 100,000, or Limit when larger.
	Scan int
	// Note is why (1..1024 bytes) and Actor who (1..256 bytes): both
	// required, recorded with each one.
	Note, Actor string
}

// Discard removes dead letters from Q.dlq for good (README, "The DLQ
// workflow"): each matching one is published, with a confirm, to the audit
// queue Q.audit (declared here, x-max-length 10000, overflow drop-head) with
// its body, properties and headers and the audit headers (action, note,
// actor, at-ms) set, then acked; the others stay. It returns how many went.
// RabbitMQ keeps no counters: as for a replay, the count is the return
// value, and the audit queue's publishes (management API) are the record.
func (q *Queue) Discard(ctx context.Context, o DiscardOptions) (int, error) {
	conn, err := q.adminConn(ctx, "discard")
	if err != nil {
		return 0, err
	}
	return discardDeadLetters(ctx, conn, q.name, o)
}

// discardDeadLetters is Queue.Discard over a connection.
func discardDeadLetters(ctx context.Context, conn *amqp.Connection, name string, o DiscardOptions) (int, error) {
	fail := func(err error) error { return fmt.Errorf("queue %s: discard: %w", name, err) }
	if err := queue.CheckDiscard(queue.DiscardAction(o.Action), o.ID, o.Note, o.Actor, o.Limit); err != nil {
		return 0, fail(err)
	}
	switch {
	case o.Reason != "" && !reasonOK(o.Reason):
		return 0, fail(fmt.Errorf("reason must be \"\" (any) or 1..128 printable ASCII characters without spaces, got %q", o.Reason))
	}
	scan := o.Scan
	if scan == 0 {
		scan = max(o.Limit, maxScan)
	}
	if scan < max(1, o.Limit) || scan > max(o.Limit, maxScan) {
		return 0, fail(fmt.Errorf("scan must be in %d..%d (limit..max(limit, %d)), got %d", max(1, o.Limit), max(o.Limit, maxScan), maxScan, scan))
	}
	limit := o.Limit
	if limit == 0 {
		limit = scan
	}
	if err := declareAudit(conn, name); err != nil {
		return 0, fail(err)
	}
	at := itoa(time.Now().UnixMilli())
	m := mover{
		limit: limit, scan: scan, what: "discard",
		match: func(d amqp.Delivery) bool {
			return (o.Reason == "" || deadLetterReason(d.Headers) == o.Reason) &&
				(o.JobType == "" || headerString(d.Headers, HeaderJobType) == o.JobType) &&
				(o.ID == "" || d.MessageId == o.ID)
		},
		publishing: func(d amqp.Delivery) (string, amqp.Publishing, error) {
			return NamesFor(name).Audit, next(d, map[string]any{HeaderAuditAction: o.Action, HeaderAuditNote: o.Note,
				HeaderAuditActor: o.Actor, HeaderAuditAtMs: at}, false), nil
		},
	}
	n, err := m.run(ctx, conn, NamesFor(name).DLQ)
	if err != nil {
		return n, fail(err)
	}
	return n, nil
}

// declareAudit declares Q.audit, idempotently, on a channel of its own (a
// declare that does not match closes its channel).
func declareAudit(conn *amqp.Connection, name string) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	_, err = ch.QueueDeclare(NamesFor(name).Audit, true, false, false, false, amqp.Table{
		"x-queue-type": "quorum", "x-max-length": int64(AuditMaxLength), "x-overflow": "drop-head",
	})
	if err != nil {
		return fmt.Errorf("declare the audit queue %s: %w", NamesFor(name).Audit, err)
	}
	return nil
}

// replayed is the message a replay publishes for dead letter d: the job
// with its id, payload and headers, without the dead letter's and the
// broker's headers.
func replayed(d amqp.Delivery, reason, dest string, keep bool, nowMs int64) amqp.Publishing {
	set := map[string]any{HeaderReason: nil, HeaderError: nil, HeaderDeadLetteredMs: nil, HeaderDueMs: nil,
		HeaderPrevDelayMs: nil, HeaderLastError: nil, HeaderDestination: dest}
	if !keep {
		set[HeaderAttempt], set[HeaderFirstEnqueuedMs] = "1", itoa(nowMs)
	}
	if reason != "" {
		set[HeaderLastReason] = reason
	}
	return next(d, set, true)
}

// deadLetterReason is a dead letter's reason: backstop's header, else the
// broker's (its latest x-death), delivery_limit shown as crash_loop.
func deadLetterReason(h amqp.Table) string {
	r := headerString(h, HeaderReason)
	if r != "" {
		return r
	}
	if deaths, ok := h["x-death"].([]any); ok && len(deaths) > 0 {
		if t, ok := deaths[0].(amqp.Table); ok {
			r = headerString(t, "reason")
		}
	}
	if r == "" {
		r = headerString(h, "x-first-death-reason")
	}
	if r == "delivery_limit" {
		return "crash_loop"
	}
	return r
}

// queueExists reports whether queue name exists, on a channel of its own:
// a passive declare of a missing queue closes its channel.
func queueExists(conn *amqp.Connection, name string) bool {
	ch, err := conn.Channel()
	if err != nil {
		return false
	}
	defer ch.Close()
	_, err = ch.QueueDeclarePassive(name, true, false, false, false, nil)
	return err == nil
}

// inspectDeadLetters is Queue.Inspect over a connection.
func inspectDeadLetters(ctx context.Context, conn *amqp.Connection, name string, n int) ([]DeadLetter, error) {
	fail := func(err error) error { return fmt.Errorf("queue %s: inspect: %w", name, err) }
	if n < 0 || n > maxScan {
		return nil, fail(fmt.Errorf("n must be in 0..%d, got %d", maxScan, n))
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, fail(err)
	}
	// Closing the channel returns every message looked at and not given
	// back.
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return nil, fail(err)
	}
	var out []DeadLetter
	var seen []amqp.Delivery
	for len(out) < n {
		if err := ctx.Err(); err != nil {
			return out, fail(err)
		}
		d, ok, err := ch.Get(NamesFor(name).DLQ, false)
		if err != nil {
			return out, fail(err)
		}
		if !ok {
			break
		}
		seen = append(seen, d)
		out = append(out, deadLetterOf(d))
	}
	// Returned at once, in order, rather than when the channel closes.
	if err := giveBack(ctx, ch, NamesFor(name).DLQ, seen); err != nil {
		return out, fail(err)
	}
	return out, nil
}

func deadLetterOf(d amqp.Delivery) DeadLetter {
	h := d.Headers
	_, attempt, _ := headerDigits(h[HeaderAttempt]) // as it is, when malformed
	first, _, _ := headerDigits(h[HeaderFirstEnqueuedMs])
	dead, _, _ := headerDigits(h[HeaderDeadLetteredMs])
	dl := DeadLetter{
		JobID: d.MessageId, Attempt: attempt, Reason: deadLetterReason(h), Error: headerString(h, HeaderError),
		JobType: headerString(h, HeaderJobType), FirstEnqueuedMs: first, DeadLetteredMs: dead,
		PayloadSize: len(d.Body), Headers: map[string]string{},
	}
	if dl.Reason == "crash_loop" && dl.Error == "" {
		dl.Error = "delivered more times than the queue's x-delivery-limit without an outcome (dead-lettered by the broker)"
	}
	if deaths, ok := h["x-death"].([]any); ok && len(deaths) > 0 && dl.DeadLetteredMs == 0 {
		if t, ok := deaths[0].(amqp.Table); ok {
			if ts, ok := t["time"].(time.Time); ok {
				dl.DeadLetteredMs = ts.UnixMilli()
			}
		}
	}
	p := d.Body
	if len(p) > 64 {
		p = p[:64]
		for len(p) > 0 && !utf8.Valid(p) {
			p = p[:len(p)-1] // not halfway through a character
		}
	}
	dl.Payload = string(p)
	for k, v := range h {
		if k == "x-delivery-count" {
			continue // the broker's count of looks, not the dead letter's
		}
		if s := headerString(h, k); s != "" {
			dl.Headers[k] = s
		} else if _, s, ok := headerDigits(v); ok {
			dl.Headers[k] = s
		} else {
			b, _ := json.Marshal(v)
			dl.Headers[k] = string(b)
		}
	}
	return dl
}

// reasonOK is the contract's rule for a reason: 1..128 printable ASCII
// characters without spaces (it names a counter and a Prometheus label).
func reasonOK(r string) bool {
	if len(r) < 1 || len(r) > 128 {
		return false
	}
	for i := 0; i < len(r); i++ {
		if r[i] <= ' ' || r[i] > '~' {
			return false
		}
	}
	return true
}

// queueStats is Queue.Stats over a connection.
func queueStats(ctx context.Context, conn *amqp.Connection, name string, opts ...StatsOption) (Stats, error) {
	fail := func(err error) error { return fmt.Errorf("queue %s: stats: %w", name, err) }
	var c statsConfig
	for _, o := range opts {
		o(&c)
	}
	var s Stats
	// One channel for every passive declare, opened again after a missing
	// queue (the broker closes the channel of a failed passive declare).
	var ch *amqp.Channel
	defer func() {
		if ch != nil {
			ch.Close()
		}
	}()
	passive := func(q string) (amqp.Queue, error) {
		if ch == nil {
			var err error
			if ch, err = conn.Channel(); err != nil {
				return amqp.Queue{}, err
			}
		}
		st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		if err != nil {
			ch.Close()
			ch = nil
		}
		return st, err
	}
	for _, q := range []string{name, NamesFor(name).DLQ} {
		if err := ctx.Err(); err != nil {
			return s, fail(err)
		}
		st, err := passive(q)
		if err != nil {
			var ae *amqp.Error
			if errors.As(err, &ae) && ae.Code == amqp.NotFound {
				return s, fail(fmt.Errorf("%w: no queue %q in this virtual host (declare it, or check the name and the URL's vhost)", ErrNoQueue, q))
			}
			return s, fail(err)
		}
		if q == name {
			s.Ready, s.Consumers = int64(st.Messages), int64(st.Consumers)
		} else {
			s.DLQ = int64(st.Messages)
		}
	}
	// The passive declare counts a level's ready messages: all of a TTL
	// level's (nobody consumes them), those of a hold level no mover holds
	// (the management API adds the held ones below). A level not declared
	// yet holds nothing.
	for n := 0; n < delayBits; n++ {
		if st, err := passive(delayExchange + itoa(int64(n))); err == nil {
			s.DelayLevels += int64(st.Messages)
		}
		if n >= holdLevels {
			continue
		}
		if st, err := passive(holdQueue + itoa(int64(n))); err == nil {
			s.DelayLevels += int64(st.Messages)
		}
	}
	if c.mgmtURL == "" {
		return s, nil
	}
	m, err := newMgmt(c.mgmtURL, c.client)
	if err != nil {
		return s, fail(err)
	}
	vhost := conn.Config.Vhost
	if vhost == "" {
		vhost = "/"
	}
	var q struct {
		Unacked *int64 `json:"messages_unacknowledged"`
	}
	if err := m.get(ctx, "/api/queues/"+url.PathEscape(vhost)+"/"+url.PathEscape(name), &q); err != nil {
		return s, fail(err)
	}
	s.Unacked = q.Unacked
	for n := range holdLevels {
		var l struct {
			Unacked int64 `json:"messages_unacknowledged"`
		}
		if err := m.get(ctx, "/api/queues/"+url.PathEscape(vhost)+"/"+url.PathEscape(holdQueue+itoa(int64(n))), &l); err == nil {
			s.DelayLevels += l.Unacked // held by movers
		}
	}
	return s, nil
}

// ErrNoQueue is returned (wrapped) by Stats when the queue or its DLQ does
// not exist.
var ErrNoQueue = errors.New("no such queue")

type mgmt struct {
	base       string
	user, pass string
	client     *http.Client
}

func newMgmt(base string, client *http.Client) (*mgmt, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("management API URL must be http(s)://[user:password@]host:port, got %q", redact.URL(base))
	}
	m := &mgmt{user: "guest", pass: "guest", client: client}
	if u.User != nil {
		m.user = u.User.Username()
		m.pass, _ = u.User.Password()
		u.User = nil
	}
	m.base = strings.TrimRight(u.String(), "/")
	if m.client == nil {
		m.client = &http.Client{Timeout: 10 * time.Second}
	}
	return m, nil
}

func (m *mgmt) get(ctx context.Context, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.base+path, nil)
	if err != nil {
		return err
	}
	req.SetBasicAuth(m.user, m.pass)
	resp, err := m.client.Do(req)
	if err != nil {
		return fmt.Errorf("management API: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("management API: GET %s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}
