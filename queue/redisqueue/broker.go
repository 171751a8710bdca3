package redisqueue

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/queue"
)

// Broker is Redis as a queue.Broker: the queues of one client, each a
// Queue behind the broker-neutral interface (queue/queuetest checks it).
type Broker struct {
	rdb   redis.UniversalClient
	queue []Option
	work  []WorkOption
}

var _ queue.Broker = (*Broker)(nil)

// BrokerOption configures NewBroker.
type BrokerOption func(*Broker)

// WithQueueOptions configures every queue the Broker opens (WithGroup,
// WithKeys).
func WithQueueOptions(opts ...Option) BrokerOption {
	return func(b *Broker) { b.queue = append(b.queue, opts...) }
}

// WithWorkOptions tunes every Work of the Broker's queues (WithBatch,
// WithPromote, WithReclaim, WithConsumer, …); queue.WorkOptions come after.
func WithWorkOptions(opts ...WorkOption) BrokerOption {
	return func(b *Broker) { b.work = append(b.work, opts...) }
}

// NewBroker returns the queues of rdb as a queue.Broker; Close closes rdb.
func NewBroker(rdb redis.UniversalClient, opts ...BrokerOption) *Broker {
	b := &Broker{rdb: rdb}
	for _, o := range opts {
		o(b)
	}
	return b
}

// Kind is "redis".
func (b *Broker) Kind() string { return "redis" }

// Open returns queue name, in the default layout unless WithQueueOptions
// says otherwise. It touches no server.
func (b *Broker) Open(name string) (queue.Queue, error) {
	if name == "" {
		return nil, errors.New("redis: queue name: must not be empty")
	}
	return &brokerQueue{q: New(b.rdb, name, b.queue...), work: b.work}, nil
}

// Close closes the client.
func (b *Broker) Close() error { return b.rdb.Close() }

// Neutral returns q behind the broker-neutral interface, its Work tuned by
// opts.
func (q *Queue) Neutral(opts ...WorkOption) queue.Queue { return &brokerQueue{q: q, work: opts} }

// brokerQueue is a Queue as a queue.Queue.
type brokerQueue struct {
	q    *Queue
	work []WorkOption
}

func (b *brokerQueue) Name() string { return b.q.name }

// Redis returns the Queue itself, for what only Redis has (job type
// counters, its keys).
func (b *brokerQueue) Redis() *Queue { return b.q }

func (b *brokerQueue) Names() queue.Names {
	k := b.q.keys
	return queue.Names{Jobs: k.Jobs, Delayed: k.Delayed, DLQ: k.DLQ, Stats: k.Stats, Audit: k.Audit()}
}

func (b *brokerQueue) Enqueue(ctx context.Context, id string, payload []byte, o queue.EnqueueOptions) (string, error) {
	if o.Delay > 0 {
		return "", queue.Unsupported("redis", b.q.name, "enqueue with a delay", "a Redis job waits only after a failed attempt")
	}
	return b.q.Enqueue(ctx, id, payload, WithJobType(o.Type))
}

// Work runs o.Concurrency Work loops (default 1), each its own consumer
// of the group: the name WithConsumer gives (default hostname-pid), with
// "-<n>" added when there are several.
func (b *brokerQueue) Work(ctx context.Context, p backstop.Decider, h queue.Handler, o queue.WorkOptions) error {
	if o.Concurrency < 0 {
		return fmt.Errorf("queue %s: work: concurrency must be at least 1 (0: one), got %d", b.q.name, o.Concurrency)
	}
	opts := append([]WorkOption(nil), b.work...)
	if o.HandlerTimeout != 0 {
		opts = append(opts, WithHandlerTimeout(o.HandlerTimeout))
	}
	if o.Logger != nil {
		opts = append(opts, WithLogger(o.Logger))
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
	n := max(1, o.Concurrency)
	if n == 1 {
		return b.q.Work(ctx, p, h, opts...)
	}
	var base worker
	for _, opt := range opts {
		opt(&base)
	}
	if base.consumer == "" {
		base.consumer = defaultConsumer()
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = b.q.Work(ctx, p, h, append(opts[:len(opts):len(opts)], WithConsumer(base.consumer+"-"+strconv.Itoa(i+1)))...)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (b *brokerQueue) Stats(ctx context.Context) (queue.Stats, error) {
	s, err := b.q.Stats(ctx)
	if err != nil {
		return queue.Stats{}, err
	}
	k := b.q.keys
	n, err := b.q.rdb.Exists(ctx, k.Jobs, k.Delayed, k.DLQ, k.Stats).Result()
	if err != nil {
		return queue.Stats{}, fmt.Errorf("queue %s: stats: %w", b.q.name, err)
	}
	return queue.Stats{Jobs: s.Jobs, Held: &s.Pending, Delayed: &s.Delayed, DeadLetters: s.DLQ,
		Counters: s.Counters, Found: n > 0, Raw: s}, nil
}

// defaultScan is how many dead letters Inspect counts by default: read
// 1000 a time, only a count kept per reason.
const defaultScan = 100_000

func (b *brokerQueue) Inspect(ctx context.Context, o queue.InspectOptions) (queue.DLQReport, error) {
	scan := o.Scan
	if scan == queue.ScanDefault {
		scan = defaultScan
	}
	switch {
	case o.Letters < 0:
		return queue.DLQReport{}, fmt.Errorf("queue %s: inspect: letters must be >= 0, got %d", b.q.name, o.Letters)
	case scan < 0:
		return queue.DLQReport{}, fmt.Errorf("queue %s: inspect: scan must be >= 0, got %d", b.q.name, o.Scan)
	}
	r, err := b.q.InspectDLQ(ctx, o.Letters, scan)
	if err != nil {
		return queue.DLQReport{}, err
	}
	out := queue.DLQReport{Size: r.Size, Scanned: r.Scanned, ByReason: r.ByReason, Newest: true, Raw: r}
	for _, d := range r.Newest {
		out.Letters = append(out.Letters, queue.DLQEntry{EntryID: d.EntryID, JobID: d.JobID, Type: d.Type,
			Attempt: d.Attempt, Reason: d.Reason, Error: d.Error})
	}
	return out, nil
}

func (b *brokerQueue) Replay(ctx context.Context, o queue.ReplayOptions) (int, error) {
	return b.q.ReplayDeadLetters(ctx, o)
}

func (b *brokerQueue) Discard(ctx context.Context, o queue.DiscardOptions) (int, error) {
	return b.q.Discard(ctx, o)
}

func (b *brokerQueue) Run(ctx context.Context, o queue.RunOptions) (queue.RunResult, error) {
	var opts []RunOption
	if o.ID != "" {
		opts = append(opts, RunID(o.ID))
	}
	if !o.DueBefore.IsZero() {
		opts = append(opts, RunDueBefore(o.DueBefore))
	}
	if o.Limit != 0 {
		opts = append(opts, RunLimit(o.Limit))
	}
	if o.Actor != "" {
		opts = append(opts, RunActor(o.Actor))
	}
	r, err := b.q.Run(ctx, opts...)
	return queue.RunResult{Moved: r.Moved, Left: r.Left}, err
}
