// Package rabbitmq is backstop's queue on RabbitMQ 3.10 or later: the
// outcomes of the Redis queue (ack, retry after a delay, dead letter with a
// reason, crash-loop detection, bounded replay) with RabbitMQ's own parts.
// README.md is the contract (topology, headers, moves) the Go, Node and
// Python workers share.
//
//	b, err := rabbitmq.Open(ctx, "amqp://guest:guest@127.0.0.1:5672/")
//	defer b.Close()
//	q := b.Queue("emails")
//	err = q.Enqueue(ctx, "job-1", payload, rabbitmq.JobType("send_email"))
//	err = q.Work(ctx, backstop.Native(pol), handler, rabbitmq.WithPrefetch(16))
package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/backstop-dev/backstop/internal/ctxtime"
	"github.com/backstop-dev/backstop/internal/redact"
)

// ErrClosed is returned by the operations of a closed Broker.
var ErrClosed = errors.New("rabbitmq: broker closed")

// Broker is a connection to RabbitMQ that reconnects by itself: after a
// broker restart or a lost connection it dials again with jittered
// exponential backoff until Close. Its queues' Enqueue and Work wait for
// the new connection and go on.
type Broker struct {
	urls []string // the URL given to Open, then WithFailover's
	cfg  brokerConfig
	at   int // index in urls of the node dialled last (dial's only)

	mu    sync.Mutex
	conn  *amqp.Connection
	gen   uint64        // connection generation: 1 for the first, +1 per reconnect
	ready chan struct{} // closed while conn is usable; replaced when it is lost
	pub   *amqp.Channel // the confirm-mode channel Enqueue publishes on (per conn)
	// levels is the generation on which the shared delay levels were
	// declared: once per connection, as the broker behind it may be new.
	levels uint64

	closed chan struct{}
	once   sync.Once
	wg     sync.WaitGroup
}

type brokerConfig struct {
	failover    []string
	log         *slog.Logger
	backoffBase time.Duration
	backoffCap  time.Duration
	amqp        amqp.Config
	queue       []QueueOption // Open's (queue.Broker): WithQueueOptions
	work        []WorkOption  // WithWorkOptions
	stats       []StatsOption // WithStatsOptions
}

// Option configures Open.
type Option func(*brokerConfig)

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(c *brokerConfig) { c.log = l } }

// WithReconnectBackoff sets the pause before the first reconnection
// attempt (default 100ms) and its cap (default 5s); each pause is drawn
// uniformly between base and the doubled previous one ("decorrelated
// jitter"), so a fleet does not reconnect in step.
func WithReconnectBackoff(base, max time.Duration) Option {
	return func(c *brokerConfig) { c.backoffBase, c.backoffCap = base, max }
}

// WithFailover names the other nodes of the same RabbitMQ cluster
// (amqp:// or amqps:// URLs): when the node the Broker is connected to
// cannot be reached, each dial tries the next, round robin, starting from
// the one that answered last. Quorum queues have members on every node, so
// a worker goes on with another node while one is down.
func WithFailover(urls ...string) Option {
	return func(c *brokerConfig) { c.failover = append(c.failover, urls...) }
}

// Open connects to the broker at url (amqp:// or amqps://) and keeps the
// connection up until Close.
//
// # Errors
//
// The first dial's error (a wrong URL, a refused login, no broker; with
// WithFailover, every node's): Open does not wait for a broker that is not
// there yet.
func Open(ctx context.Context, url string, opts ...Option) (*Broker, error) {
	cfg := brokerConfig{log: slog.Default(), backoffBase: 100 * time.Millisecond, backoffCap: 5 * time.Second,
		amqp: amqp.Config{Heartbeat: 10 * time.Second, Locale: "en_US", Properties: amqp.Table{"connection_name": "backstop"}}}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.backoffBase <= 0 || cfg.backoffCap < cfg.backoffBase {
		return nil, fmt.Errorf("rabbitmq: WithReconnectBackoff: need 0 < base <= max, got %v, %v", cfg.backoffBase, cfg.backoffCap)
	}
	b := &Broker{urls: append([]string{url}, cfg.failover...), cfg: cfg, closed: make(chan struct{}), ready: make(chan struct{})}
	conn, err := b.dial(ctx)
	if err != nil && len(b.urls) == 1 {
		return nil, fmt.Errorf("rabbitmq: open %s: %w", redact.URL(url), err)
	}
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: open: %w", err) // each node's, named
	}
	b.setConn(conn)
	return b, nil
}

// dial connects to the node that answered last, else to the next ones in
// turn; its error names each node's.
func (b *Broker) dial(ctx context.Context) (*amqp.Connection, error) {
	var errs []error
	for i := range b.urls {
		at := (b.at + i) % len(b.urls)
		conn, err := b.dialURL(ctx, b.urls[at])
		if err == nil {
			b.at = at
			return conn, nil
		}
		if ctx.Err() != nil || len(b.urls) == 1 {
			return nil, err
		}
		errs = append(errs, fmt.Errorf("%s: %w", redact.URL(b.urls[at]), err))
	}
	return nil, errors.Join(errs...)
}

func (b *Broker) dialURL(ctx context.Context, url string) (*amqp.Connection, error) {
	type result struct {
		c   *amqp.Connection
		err error
	}
	res := make(chan result, 1)
	go func() {
		c, err := amqp.DialConfig(url, b.cfg.amqp)
		res <- result{c, redact.Error(err, url)} // a URL that does not parse is in the error
	}()
	select {
	case r := <-res:
		return r.c, r.err
	case <-ctx.Done():
		go func() { // the dial ends by itself: close what it opens
			if r := <-res; r.c != nil {
				r.c.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// setConn installs a new connection and watches it.
func (b *Broker) setConn(conn *amqp.Connection) {
	lost := conn.NotifyClose(make(chan *amqp.Error, 1))
	blocked := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	b.wg.Add(1)
	go func() { // ends when conn closes (blocked is closed with it)
		defer b.wg.Done()
		b.logBlocked(blocked)
	}()
	b.mu.Lock()
	b.conn, b.pub = conn, nil
	b.gen++
	close(b.ready)
	b.mu.Unlock()
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		select {
		case err := <-lost:
			b.reconnect(err)
		case <-b.closed:
		}
	}()
}

// logBlocked logs each change of the connection's blocked state once: the
// broker blocks a connection that publishes while a memory or disk alarm is
// on, and the worker's and mover's confirms wait meanwhile (README, "A
// confirm is never timed out").
func (b *Broker) logBlocked(blocked <-chan amqp.Blocking) {
	was := false
	for bl := range blocked {
		switch {
		case bl.Active && !was:
			b.cfg.log.Warn("rabbitmq connection blocked", "reason", bl.Reason)
		case !bl.Active && was:
			b.cfg.log.Info("rabbitmq connection unblocked")
		}
		was = bl.Active
	}
}

// reconnect dials until it succeeds or the Broker is closed.
func (b *Broker) reconnect(why *amqp.Error) {
	b.mu.Lock()
	b.ready = make(chan struct{})
	b.conn, b.pub = nil, nil
	b.mu.Unlock()
	b.cfg.log.Warn("rabbitmq connection lost; reconnecting", "err", why)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-b.closed:
			cancel()
		case <-ctx.Done():
		}
	}()
	pause, tries := b.cfg.backoffBase, 0
	for {
		tries++
		conn, err := b.dial(ctx)
		if err == nil {
			b.cfg.log.Info("rabbitmq reconnected", "attempts", tries)
			b.setConn(conn)
			return
		}
		if ctx.Err() != nil {
			return
		}
		if tries == 1 || tries%20 == 0 {
			b.cfg.log.Warn("rabbitmq reconnect failed", "attempts", tries, "err", err)
		}
		pause = min(b.cfg.backoffCap, b.cfg.backoffBase+time.Duration(rand.Int64N(int64(pause*3-b.cfg.backoffBase)+1)))
		if !ctxtime.Sleep(ctx, pause) {
			return
		}
	}
}

// connection returns the current connection and its generation, waiting
// for a reconnection in progress.
func (b *Broker) connection(ctx context.Context) (*amqp.Connection, uint64, error) {
	for {
		b.mu.Lock()
		conn, gen, ready := b.conn, b.gen, b.ready
		b.mu.Unlock()
		if conn != nil && !conn.IsClosed() {
			return conn, gen, nil
		}
		select {
		case <-b.closed:
			return nil, 0, ErrClosed
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		case <-ready:
			if conn != nil { // closed, not yet noticed: let the watcher see it
				if !ctxtime.Sleep(ctx, 10*time.Millisecond) {
					return nil, 0, ctx.Err()
				}
			}
		}
	}
}

// channel opens a channel on the current connection, in confirm mode.
func (b *Broker) channel(ctx context.Context) (*amqp.Channel, uint64, error) {
	conn, gen, err := b.connection(ctx)
	if err != nil {
		return nil, 0, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, 0, err
	}
	if err := ch.Confirm(false); err != nil {
		ch.Close()
		return nil, 0, err
	}
	return ch, gen, nil
}

// publisher returns the shared confirm-mode channel Enqueue publishes on,
// opening one when there is none or it was closed.
func (b *Broker) publisher(ctx context.Context) (*amqp.Channel, uint64, error) {
	b.mu.Lock()
	ch, gen := b.pub, b.gen
	b.mu.Unlock()
	if ch != nil && !ch.IsClosed() {
		return ch, gen, nil
	}
	ch, gen, err := b.channel(ctx)
	if err != nil {
		return nil, 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.gen == gen && (b.pub == nil || b.pub.IsClosed()) {
		b.pub = ch
		return ch, gen, nil
	}
	ch.Close() // another caller won the race
	if b.pub == nil {
		return nil, 0, amqp.ErrClosed
	}
	return b.pub, b.gen, nil
}

// Close closes the connection and stops reconnecting. Queues' Work loops
// return. Idempotent.
func (b *Broker) Close() error {
	var err error
	b.once.Do(func() {
		close(b.closed)
		b.mu.Lock()
		conn := b.conn
		b.conn, b.pub = nil, nil
		b.mu.Unlock()
		if conn != nil {
			err = conn.Close()
			if errors.Is(err, amqp.ErrClosed) {
				err = nil
			}
		}
		b.wg.Wait()
	})
	return err
}
