package main

import (
	"context"
	"io"

	"github.com/backstop-dev/backstop/queue/rabbitmq"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// A cliQueue is one queue on one broker as the queue and dlq commands use
// it: redisCLI or rabbitCLI. A command parses its flags, picks the broker
// (queueFlags.broker), checks what does not need the broker, and writes
// the same lines whatever the broker; only the reads and the moves differ.
type cliQueue interface {
	// where names the queue's jobs, dead letters and audit, as the
	// commands' lines say where things went.
	where() queueNames
	// stats and inspect are queue stats and dlq inspect: a broker's own
	// figures, checked and printed its own way.
	stats(ctx context.Context, stdout, stderr io.Writer) error
	inspect(ctx context.Context, newest int, scan int64, stdout, stderr io.Writer) error
	// preflight runs before a move of dead letters with reason ("" = any):
	// Redis warns of a queue or a reason it has never seen; RabbitMQ
	// connects, and refuses a queue that does not exist.
	preflight(ctx context.Context, reason string, stderr io.Writer) error
	// replay and discard move dead letters; their options are the Redis
	// contract's (the reference), which RabbitMQ's mirror.
	replay(ctx context.Context, o redisqueue.ReplayOptions) (int, error)
	discard(ctx context.Context, o redisqueue.DiscardOptions) (int, error)
	close()
}

// queueNames are where a queue's jobs, dead letters and discard audit live.
type queueNames struct{ name, jobs, dlq, audit string }

var (
	_ cliQueue = (*redisCLI)(nil)
	_ cliQueue = (*rabbitCLI)(nil)
)

// broker parses args and returns the queue on the broker they name
// (RabbitMQ with --amqp.url, else Redis). A Redis client is made at once
// (it connects at its first command); RabbitMQ is reached by the first
// method that needs it.
func (f *queueFlags) broker(args []string) (cliQueue, error) {
	rabbit, err := f.useRabbit(args)
	if err != nil {
		return nil, err
	}
	if rabbit {
		return &rabbitCLI{f: f}, nil
	}
	q, done, err := f.open(args)
	if err != nil {
		return nil, err
	}
	return &redisCLI{f: f, q: q, done: done}, nil
}

// redisCLI is a queue of a Redis.
type redisCLI struct {
	f    *queueFlags
	q    *redisqueue.Queue
	done func()
}

func (r *redisCLI) where() queueNames {
	k := r.q.Keys()
	return queueNames{name: r.q.Name(), jobs: k.Jobs, dlq: k.DLQ, audit: r.q.AuditKey()}
}

func (r *redisCLI) preflight(ctx context.Context, reason string, stderr io.Writer) error {
	r.f.warnMissing(ctx, r.q, stderr)
	if reason != "" {
		warnReason(ctx, r.q, reason, stderr)
	}
	return nil
}

func (r *redisCLI) replay(ctx context.Context, o redisqueue.ReplayOptions) (int, error) {
	return r.q.ReplayDeadLetters(ctx, o)
}

func (r *redisCLI) discard(ctx context.Context, o redisqueue.DiscardOptions) (int, error) {
	return r.q.Discard(ctx, o)
}

func (r *redisCLI) close() { r.done() }

// rabbitCLI is a queue of a RabbitMQ virtual host.
type rabbitCLI struct {
	f    *queueFlags
	q    *rabbitmq.Queue // nil until connect
	done func()
}

// connect reaches the broker, once.
func (r *rabbitCLI) connect(ctx context.Context) error {
	if r.q != nil {
		return nil
	}
	q, done, err := r.f.openRabbit(ctx)
	if err != nil {
		return err
	}
	r.q, r.done = q, done
	return nil
}

func (r *rabbitCLI) where() queueNames {
	n := *r.f.name
	return queueNames{name: n, jobs: n, dlq: n + ".dlq", audit: n + ".audit"}
}

func (r *rabbitCLI) preflight(ctx context.Context, _ string, _ io.Writer) error {
	if err := r.connect(ctx); err != nil {
		return err
	}
	// A misspelt queue is an error before anything moves.
	_, err := r.q.Stats(ctx)
	return err
}

func (r *rabbitCLI) replay(ctx context.Context, o redisqueue.ReplayOptions) (int, error) {
	ro := rabbitmq.ReplayOptions{Limit: o.Limit, Reason: o.Reason, JobType: o.JobType, ID: o.ID, KeepAttempts: o.KeepAttempts, Rate: o.Rate}
	if ro.ID != "" && ro.Limit == 0 {
		ro.Limit, ro.Scan = maxRabbitPeek, maxRabbitPeek // every dead letter of the job
	}
	return r.q.Replay(ctx, ro)
}

func (r *rabbitCLI) discard(ctx context.Context, o redisqueue.DiscardOptions) (int, error) {
	return r.q.Discard(ctx, rabbitmq.DiscardOptions{Action: string(o.Action), ID: o.ID, Reason: o.Reason,
		JobType: o.JobType, Limit: o.Limit, Note: o.Note, Actor: o.Actor})
}

func (r *rabbitCLI) close() {
	if r.done != nil {
		r.done()
	}
}
