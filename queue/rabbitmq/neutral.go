package rabbitmq

import (
	"context"
	"fmt"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/rabbitmq/rabbitnames"
)

// The Broker as a queue.Broker: the broker-neutral interface the CLI, the
// demo and queue/queuetest use.

var _ queue.Broker = (*Broker)(nil)

// Names are the parts of a work queue (package rabbitnames: the names
// without the client).
type Names = rabbitnames.Names

// NamesFor returns the names of work queue q: Q, Q.dlq, Q.delay, Q.due,
// Q.audit.
func NamesFor(q string) Names { return rabbitnames.For(q) }

// WithQueueOptions configures every queue the Broker's Open returns
// (WithMaxDeliveries).
func WithQueueOptions(opts ...QueueOption) Option {
	return func(c *brokerConfig) { c.queue = append(c.queue, opts...) }
}

// WithWorkOptions tunes every Work of the queues the Broker's Open returns
// (WithPrefetch, WithConsumerTag, …); queue.WorkOptions come after.
func WithWorkOptions(opts ...WorkOption) Option {
	return func(c *brokerConfig) { c.work = append(c.work, opts...) }
}

// WithStatsOptions configures the Stats of the queues the Broker's Open
// returns (WithManagementAPI).
func WithStatsOptions(opts ...StatsOption) Option {
	return func(c *brokerConfig) { c.stats = append(c.stats, opts...) }
}

// Kind is "rabbitmq".
func (b *Broker) Kind() string { return "rabbitmq" }

// Open returns work queue name behind the broker-neutral interface,
// configured by WithQueueOptions. It declares nothing: Enqueue and Work
// do, and the other operations of a queue that does not exist fail
// (ErrNoQueue).
func (b *Broker) Open(name string) (queue.Queue, error) {
	q := b.Queue(name, b.cfg.queue...)
	if err := q.validate(); err != nil {
		return nil, err
	}
	return &brokerQueue{q: q}, nil
}

// brokerQueue is a Queue as a queue.Queue.
type brokerQueue struct{ q *Queue }

func (b *brokerQueue) Name() string { return b.q.name }

func (b *brokerQueue) Names() queue.Names {
	n := NamesFor(b.q.name)
	return queue.Names{Jobs: n.Queue, Delayed: n.Delay, DLQ: n.DLQ, Audit: n.Audit}
}

func (b *brokerQueue) Enqueue(ctx context.Context, id string, payload []byte, o queue.EnqueueOptions) (string, error) {
	var opts []EnqueueOption
	if o.Type != "" {
		opts = append(opts, JobType(o.Type))
	}
	if o.Delay != 0 {
		opts = append(opts, Delay(o.Delay))
	}
	return "", b.q.Enqueue(ctx, id, payload, opts...)
}

// Work runs o.Concurrency jobs at once (default: the prefetch, 16), with a
// prefetch of at least as many.
func (b *brokerQueue) Work(ctx context.Context, p backstop.Decider, h queue.Handler, o queue.WorkOptions) error {
	opts := append([]WorkOption(nil), b.q.b.cfg.work...)
	if o.Concurrency != 0 {
		var c workConfig
		for _, opt := range opts {
			opt(&c)
		}
		opts = append(opts, WithConcurrency(o.Concurrency))
		if c.prefetch < o.Concurrency {
			opts = append(opts, WithPrefetch(o.Concurrency))
		}
	}
	if o.HandlerTimeout != 0 {
		opts = append(opts, WithHandlerTimeout(o.HandlerTimeout))
	}
	if o.Logger != nil {
		opts = append(opts, func(c *workConfig) { c.log = o.Logger })
	}
	if o.Metrics != nil || o.PolicyName != "" {
		opts = append(opts, WithMetrics(o.Metrics, o.PolicyName))
	}
	if o.Policies != nil {
		opts = append(opts, WithPolicies(o.Policies))
	}
	if o.OnOutcome != nil {
		opts = append(opts, WithOutcomeHook(o.OnOutcome))
	}
	return b.q.Work(ctx, p, h, opts...)
}

func (b *brokerQueue) Stats(ctx context.Context) (queue.Stats, error) {
	s, err := b.q.Stats(ctx, b.q.b.cfg.stats...)
	if err != nil {
		return queue.Stats{}, err
	}
	jobs := s.Ready
	if s.Unacked != nil {
		jobs += *s.Unacked // as Redis counts them: those a worker holds too
	}
	return queue.Stats{Jobs: jobs, Held: s.Unacked, DeadLetters: s.DLQ, Found: true, Raw: s}, nil
}

// InspectReport is what Inspect of the broker-neutral queue reads: the
// DLQ's size, its first dead letters counted by reason, and the oldest.
type InspectReport struct {
	Size     int64            `json:"size"`
	Scanned  int64            `json:"scanned"`
	ByReason map[string]int64 `json:"by_reason"`
	Oldest   []DeadLetter     `json:"oldest"`
}

// defaultScan is how many dead letters Inspect counts by default: each
// one is a round trip (basic.get), and a default answers at once.
const defaultScan = 1000

// Inspect counts the first o.Scan dead letters (default 1000, at most
// 100,000: each is held until all are counted) by reason, and lists the
// oldest o.Letters: a queue is read from its head.
func (b *brokerQueue) Inspect(ctx context.Context, o queue.InspectOptions) (queue.DLQReport, error) {
	scan := o.Scan
	if scan == queue.ScanDefault {
		scan = defaultScan
	}
	switch {
	case o.Letters < 0 || o.Letters > maxScan:
		return queue.DLQReport{}, fmt.Errorf("queue %s: inspect: letters must be in 0..%d, got %d", b.q.name, maxScan, o.Letters)
	case scan < 0 || scan > maxScan:
		return queue.DLQReport{}, fmt.Errorf("queue %s: inspect: scan must be in 0..%d, got %d", b.q.name, maxScan, o.Scan)
	}
	s, err := b.q.Stats(ctx)
	if err != nil {
		return queue.DLQReport{}, err
	}
	dls, err := b.q.Inspect(ctx, int(max(scan, int64(o.Letters))))
	if err != nil {
		return queue.DLQReport{}, err
	}
	rep := InspectReport{Size: s.DLQ, Scanned: int64(len(dls)), ByReason: map[string]int64{}}
	for _, d := range dls {
		rep.ByReason[d.Reason]++
	}
	rep.Oldest = dls[:min(o.Letters, len(dls))]
	out := queue.DLQReport{Size: rep.Size, Scanned: rep.Scanned, ByReason: rep.ByReason, Raw: rep}
	for _, d := range rep.Oldest {
		out.Letters = append(out.Letters, queue.DLQEntry{JobID: d.JobID, Type: d.JobType, Attempt: d.Attempt,
			Reason: d.Reason, Error: d.Error})
	}
	return out, nil
}

// Replay replays as Queue.Replay; with an ID and no Limit, every dead
// letter of that job among the first 100,000.
func (b *brokerQueue) Replay(ctx context.Context, o queue.ReplayOptions) (int, error) {
	ro := ReplayOptions{Limit: o.Limit, Reason: o.Reason, JobType: o.JobType, ID: o.ID, KeepAttempts: o.KeepAttempts, Rate: o.Rate, Actor: o.Actor}
	if ro.ID != "" && ro.Limit == 0 {
		ro.Limit, ro.Scan = maxScan, maxScan
	}
	return b.q.Replay(ctx, ro)
}

func (b *brokerQueue) Discard(ctx context.Context, o queue.DiscardOptions) (int, error) {
	return b.q.Discard(ctx, DiscardOptions{Action: string(o.Action), ID: o.ID, Reason: o.Reason, JobType: o.JobType,
		Limit: o.Limit, Note: o.Note, Actor: o.Actor})
}
