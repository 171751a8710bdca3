package rabbitmq

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// DefaultMaxDeliveries is how many deliveries of one message a worker
// allows (x-delivery-count) before it dead-letters it as a crash loop.
const DefaultMaxDeliveries = 5

// Queue is a work queue on a Broker, with its DLQ and its delay exchanges
// (README, "Topology").
type Queue struct {
	b             *Broker
	name          string
	maxDeliveries int

	mu       sync.Mutex
	declared uint64 // the connection generation Declare last ran on
}

// QueueOption configures a Queue.
type QueueOption func(*Queue)

// WithMaxDeliveries sets how many deliveries of one message a worker runs
// before it dead-letters the message with reason crash_loop (default 5;
// the queue's x-delivery-limit is this + 2, the broker's own backstop for
// workers that die first). The value is part of the queue's arguments:
// every worker and producer of a queue must use the same.
func WithMaxDeliveries(n int) QueueOption { return func(q *Queue) { q.maxDeliveries = n } }

// Queue returns the work queue name. Nothing is declared until Declare,
// Enqueue or Work.
func (b *Broker) Queue(name string, opts ...QueueOption) *Queue {
	q := &Queue{b: b, name: name, maxDeliveries: DefaultMaxDeliveries}
	for _, o := range opts {
		o(q)
	}
	return q
}

// Name returns the work queue's name.
func (q *Queue) Name() string { return q.name }

// validate reports a name or option that cannot work, before the broker.
func (q *Queue) validate() error {
	switch {
	case q.name == "":
		return fmt.Errorf("rabbitmq: queue name: must not be empty")
	case len(q.name) > 200:
		// Q.dlq, Q.delay and Q.due must fit AMQP's 255-byte short string.
		return fmt.Errorf("rabbitmq: queue name %q: must be at most 200 bytes, got %d", q.name, len(q.name))
	case q.maxDeliveries < 1:
		return fmt.Errorf("rabbitmq: queue %s: WithMaxDeliveries: must be at least 1, got %d", q.name, q.maxDeliveries)
	}
	return nil
}

// Declare declares the queue's topology and the shared delay levels,
// idempotently (README, "Topology"); Enqueue and Work call it, once per
// connection.
//
// # Errors
//
// A queue that exists with other arguments (another WithMaxDeliveries, a
// classic queue of the same name): the broker's PRECONDITION_FAILED,
// naming the queue.
func (q *Queue) Declare(ctx context.Context) error {
	if err := q.validate(); err != nil {
		return err
	}
	conn, gen, err := q.b.connection(ctx)
	if err != nil {
		return err
	}
	return q.declareOn(conn, gen)
}

// ensure declares the topology unless it was declared on connection gen.
func (q *Queue) ensure(ctx context.Context) error {
	q.mu.Lock()
	done := q.declared
	q.mu.Unlock()
	q.b.mu.Lock()
	gen := q.b.gen
	q.b.mu.Unlock()
	if done == gen {
		return nil
	}
	return q.Declare(ctx)
}

func (q *Queue) declareOn(conn *amqp.Connection, gen uint64) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("rabbitmq: declare %s: %w", q.name, err)
	}
	defer ch.Close()
	q.b.mu.Lock()
	levels := q.b.levels
	q.b.mu.Unlock()
	if levels != gen {
		if err := declareLevels(ch); err != nil {
			return fmt.Errorf("rabbitmq: declare the delay levels: %w", err)
		}
		q.b.mu.Lock()
		q.b.levels = gen
		q.b.mu.Unlock()
	}
	if err := q.declareQueue(ch); err != nil {
		return fmt.Errorf("rabbitmq: declare %s: %w", q.name, err)
	}
	q.mu.Lock()
	q.declared = gen
	q.mu.Unlock()
	return nil
}

func (q *Queue) declareQueue(ch *amqp.Channel) error {
	n, names := q.name, NamesFor(q.name)
	if _, err := ch.QueueDeclare(n, true, false, false, false, amqp.Table{
		"x-queue-type":              "quorum",
		"x-delivery-limit":          int64(q.maxDeliveries + 2),
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": names.DLQ,
		"x-dead-letter-strategy":    "at-least-once",
		"x-overflow":                "reject-publish",
	}); err != nil {
		return err
	}
	if _, err := ch.QueueDeclare(names.DLQ, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		return err
	}
	for _, x := range []string{names.Delay, names.Due} {
		if err := ch.ExchangeDeclare(x, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
			return err
		}
	}
	if err := ch.ExchangeBind(enterXchg, "", names.Delay, false, nil); err != nil {
		return err
	}
	// The topology before backstop.delay.enter bound Q.delay to L17: with
	// both, the broker routes each message once (to a set of queues) but
	// still walks the slow path. Unbinding one that is not there is a no-op.
	if err := ch.ExchangeUnbind(delayExchange+strconv.Itoa(delayBits-1), "", names.Delay, false, nil); err != nil {
		return err
	}
	if err := ch.QueueBind(n, "", names.Due, false, nil); err != nil {
		return err
	}
	return ch.ExchangeBind(names.Due, "", deliverXchg, false, amqp.Table{"x-match": "all", HeaderDestination: n})
}

// declareLevels declares the delay levels every queue of the virtual host
// shares: exchange L<n> routes a message whose bit n is 1 to queue hold.L<n>,
// where a mover holds it for 2^n s and then publishes it to exchange L<n-1>
// (mover.go), else on to exchange L<n-1> at once; L0's next is the deliver
// exchange, which routes by backstop-destination. The first topology's TTL
// queues L<n> (dead-lettering to exchange L<n-1>) are still declared, so
// that messages delayed before an upgrade drain, but no longer bound for
// n < holdLevels: RabbitMQ 3.10 can lose the process that dead-letters them
// (README, "The moves between levels are the workers'"). A message enters at the
// level of its delay's highest set bit (the enter exchange), not at L17:
// every exchange-to-exchange hop costs the publishing channel a topic
// match, and 18 of them made a delayed publish 5 to 9 times slower
// (BENCHMARKS.md).
func declareLevels(ch *amqp.Channel) error {
	if err := ch.ExchangeDeclare(deliverXchg, amqp.ExchangeHeaders, true, false, false, false, nil); err != nil {
		return err
	}
	for n := 0; n < delayBits; n++ {
		name := delayExchange + strconv.Itoa(n)
		lower := deliverXchg
		if n > 0 {
			lower = delayExchange + strconv.Itoa(n-1)
		}
		if err := ch.ExchangeDeclare(name, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			return err
		}
		if _, err := ch.QueueDeclare(name, true, false, false, false, amqp.Table{
			"x-queue-type":           "quorum",
			"x-message-ttl":          int64(1000) << n,
			"x-dead-letter-exchange": lower,
			"x-dead-letter-strategy": "at-least-once",
			"x-overflow":             "reject-publish",
		}); err != nil {
			return err
		}
		if n < holdLevels {
			// Bit n set: to the hold queue, which the movers empty. The
			// hold queue is bound before the TTL queue is unbound, so a
			// message routed meanwhile goes to both (a duplicate), never
			// to neither.
			hold := holdQueue + strconv.Itoa(n)
			if _, err := ch.QueueDeclare(hold, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
				return err
			}
			if err := ch.QueueBind(hold, levelPattern(n, '1'), name, false, nil); err != nil {
				return err
			}
			if err := ch.QueueUnbind(name, levelPattern(n, '1'), name, nil); err != nil {
				return err
			}
		} else if err := ch.QueueBind(name, levelPattern(n, '1'), name, false, nil); err != nil {
			return err // no delay routes here since the cap; kept for older producers
		}
		if err := ch.ExchangeBind(lower, levelPattern(n, '0'), name, false, nil); err != nil {
			return err
		}
	}
	if err := ch.ExchangeDeclare(enterXchg, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return err
	}
	for n := 0; n < delayBits; n++ {
		if err := ch.ExchangeBind(delayExchange+strconv.Itoa(n), enterPattern(n), enterXchg, false, nil); err != nil {
			return err
		}
	}
	// Where the movers dead-letter a delayed message whose work queue and
	// DLQ are both gone (mover.go).
	if _, err := ch.QueueDeclare(UnroutableQueue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		return err
	}
	// Where Run asks the movers for the delayed jobs they hold (run.go).
	if err := ch.ExchangeDeclare(RunExchange, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
		return err
	}
	// A delay of 0 s (no bit set) goes straight to its queue.
	return ch.ExchangeBind(deliverXchg, delayRoutingKey(0), enterXchg, false, nil)
}
