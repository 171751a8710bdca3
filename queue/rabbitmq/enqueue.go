package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/backstop-dev/backstop/internal/ctxtime"
	"github.com/backstop-dev/backstop/queue"
)

// ErrRejected is returned (wrapped) when the broker refuses a message: a
// negative publisher confirm, such as a full queue's (x-overflow =
// reject-publish).
var ErrRejected = errors.New("rabbitmq: the broker rejected the message")

// EnqueueOption configures one Enqueue.
type EnqueueOption func(*enqueueConfig)

type enqueueConfig struct {
	jobType     string
	contentType string
	delay       time.Duration
}

// JobType sets the job's type (the backstop-job-type header: send_email,
// …), kept through every move; a WithPolicies policy and the metrics'
// job_type label read it. It must be a valid type (queue.ValidJobType).
func JobType(t string) EnqueueOption { return func(c *enqueueConfig) { c.jobType = t } }

// ContentType sets the message's content_type property (default none).
func ContentType(ct string) EnqueueOption { return func(c *enqueueConfig) { c.contentType = ct } }

// Delay makes the job's first attempt wait d (rounded up to whole
// seconds) in the delay levels; at most MaxDueAhead (30 days): a worker
// dead-letters a message due later as malformed.
func Delay(d time.Duration) EnqueueOption { return func(c *enqueueConfig) { c.delay = d } }

// Enqueue adds a job: id is its stable identity (message_id, the
// idempotency key), payload its body, byte for byte. It returns once the
// broker has confirmed the message (publisher confirms). While the
// connection is lost (a broker restart), it waits for the reconnection
// and publishes again, until ctx is done: a job is enqueued at least once.
// A negative confirm means the broker did not take the message (a full
// queue, or a quorum queue just created and not yet taking publishes), so
// Enqueue publishes it again after a short jittered pause, up to
// rejectTries times in all (about 1.5 s of pauses), before it gives up.
//
// # Errors
//
// An empty id or an invalid JobType, before the broker; ErrRejected
// (wrapped) when every try was refused; ctx's error; ErrClosed.
func (q *Queue) Enqueue(ctx context.Context, id string, payload []byte, opts ...EnqueueOption) error {
	var c enqueueConfig
	for _, o := range opts {
		o(&c)
	}
	if id == "" {
		return fmt.Errorf("rabbitmq: enqueue to %s: id: must not be empty", q.name)
	}
	if c.jobType != "" {
		if err := queue.ValidJobType(c.jobType); err != nil {
			return fmt.Errorf("rabbitmq: enqueue to %s: JobType: %w", q.name, err)
		}
	}
	if c.delay < 0 || c.delay > MaxDueAhead {
		return fmt.Errorf("rabbitmq: enqueue to %s: Delay: must be in 0..%v (30 days), got %v", q.name, MaxDueAhead, c.delay)
	}
	if err := q.validate(); err != nil {
		return err
	}
	now := time.Now().UnixMilli()
	h := amqp.Table{HeaderAttempt: "1", HeaderFirstEnqueuedMs: itoa(now), HeaderDestination: q.name}
	if c.jobType != "" {
		h[HeaderJobType] = c.jobType
	}
	exchange, key := "", q.name
	if c.delay > 0 {
		secs := delaySeconds(c.delay)
		exchange, key = NamesFor(q.name).Delay, delayRoutingKey(secs)
		h[HeaderDueMs] = itoa(now + c.delay.Milliseconds())
	}
	msg := amqp.Publishing{Headers: h, ContentType: c.contentType, DeliveryMode: amqp.Persistent,
		MessageId: id, Timestamp: time.UnixMilli(now), Body: payload}
	return q.publish(ctx, exchange, key, msg)
}

// rejectTries bounds Enqueue's publishes of one message the broker
// refuses (negative confirms); rejectPause is the first pause between
// them, doubled each time and jittered.
const (
	rejectTries = 6
	rejectPause = 50 * time.Millisecond
)

// publish publishes msg on the shared confirm channel and waits for the
// confirm, publishing again after a lost channel or connection, and after
// a negative confirm at most rejectTries times in all.
func (q *Queue) publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	pause := 50 * time.Millisecond
	rejected, rpause := 0, rejectPause
	for {
		err := q.publishOnce(ctx, exchange, key, msg)
		if errors.Is(err, ErrRejected) && ctx.Err() == nil {
			if rejected++; rejected < rejectTries {
				// Not taken, so sending again cannot duplicate. Jittered
				// in [pause/2, pause]: producers refused together do not
				// come back together.
				d := rpause/2 + time.Duration(rand.Int64N(int64(rpause/2)+1))
				q.b.cfg.log.Debug("rabbitmq publish rejected; trying again", "queue", q.name, "tries", rejected, "pause", d, "err", err)
				if !ctxtime.Sleep(ctx, d) {
					return fmt.Errorf("rabbitmq: enqueue to %s: %w (last error: %v)", q.name, ctx.Err(), err)
				}
				rpause *= 2
				continue
			}
		}
		if err == nil || errors.Is(err, ErrRejected) || errors.Is(err, ErrClosed) || ctx.Err() != nil {
			if err != nil && ctx.Err() != nil && !errors.Is(err, ErrRejected) {
				return fmt.Errorf("rabbitmq: enqueue to %s: %w (last error: %v)", q.name, ctx.Err(), err)
			}
			return err
		}
		q.b.cfg.log.Debug("rabbitmq publish failed; trying again", "queue", q.name, "err", err)
		if !ctxtime.Sleep(ctx, pause) {
			return fmt.Errorf("rabbitmq: enqueue to %s: %w (last error: %v)", q.name, ctx.Err(), err)
		}
		pause = min(2*pause, 2*time.Second)
	}
}

func (q *Queue) publishOnce(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	if err := q.ensure(ctx); err != nil {
		return err
	}
	ch, _, err := q.b.publisher(ctx)
	if err != nil {
		return err
	}
	err = confirmPublish(ctx, ch, exchange, key, msg)
	if errors.Is(err, ErrRejected) {
		return fmt.Errorf("%w: enqueue %s to %s (a full queue refuses with x-overflow=reject-publish)", err, msg.MessageId, q.name)
	}
	return err
}

// confirmPublish publishes msg on ch (in confirm mode) and waits for the
// broker's confirm: amqp.ErrClosed when the channel went first (publish
// again), ErrRejected for a negative confirm.
func confirmPublish(ctx context.Context, ch *amqp.Channel, exchange, key string, msg amqp.Publishing) error {
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, false, false, msg)
	if err != nil {
		return err
	}
	return waitConfirm(ctx, ch, dc)
}

// waitConfirm waits for the confirm of a message published on ch:
// amqp.ErrClosed when the channel went first (publish again), ErrRejected
// for a negative confirm.
func waitConfirm(ctx context.Context, ch *amqp.Channel, dc *amqp.DeferredConfirmation) error {
	ok, err := dc.WaitContext(ctx)
	switch {
	case err != nil:
		return err
	case ok:
		return nil
	case ch.IsClosed():
		return amqp.ErrClosed
	}
	return ErrRejected
}

// afterGrace returns a context that is done grace after ctx is done (and
// when stop is called): confirms are awaited with no timeout while a worker
// runs, and for at most grace once it stops.
func afterGrace(ctx context.Context, grace time.Duration) (context.Context, context.CancelFunc) {
	g, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(grace, cancel) })
	return g, func() {
		stop()
		cancel()
	}
}
