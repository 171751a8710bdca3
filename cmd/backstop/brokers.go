package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/rabbitmq"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// The queue and dlq commands reach a broker through queue.Queue alone: a
// command parses its flags, picks the broker (queueFlags.broker), checks
// what does not need the broker, and writes the same lines whatever the
// broker. This file is where a broker is chosen and opened, and where the
// figures only one broker has are printed.

// cliQueue is the queue a command works on, opened at its first use.
type cliQueue struct {
	f    *queueFlags
	kind cliBroker
	q    queue.Queue // nil until opened
	// open reaches the broker: at once for Redis (a client connects at
	// its first command), at the first use for RabbitMQ.
	open func(ctx context.Context) (queue.Queue, func(), error)
	done func()
}

// cliBroker is what the commands' lines say of a broker.
type cliBroker struct {
	kind    string // queue.Broker's Kind
	name    string // "Redis", "RabbitMQ"
	urlFlag string // the flag that says where it is
}

var (
	redisBroker  = cliBroker{kind: "redis", name: "Redis", urlFlag: "--redis.url"}
	rabbitBroker = cliBroker{kind: "rabbitmq", name: "RabbitMQ", urlFlag: "--amqp.url"}
)

// broker parses args and returns the queue on the broker they name
// (RabbitMQ with --amqp.url, else Redis).
func (f *queueFlags) broker(args []string) (*cliQueue, error) {
	rabbit, err := f.useRabbit(args)
	if err != nil {
		return nil, err
	}
	if rabbit {
		return &cliQueue{f: f, kind: rabbitBroker, open: f.openRabbit}, nil
	}
	b, done, err := f.openRedis(args)
	if err != nil {
		return nil, err
	}
	q, err := b.Open(*f.name)
	if err != nil {
		done()
		return nil, err
	}
	return &cliQueue{f: f, kind: redisBroker, q: q, done: done}, nil
}

// queue returns the queue, reaching the broker once.
func (c *cliQueue) queue(ctx context.Context) (queue.Queue, error) {
	if c.q != nil {
		return c.q, nil
	}
	q, done, err := c.open(ctx)
	if err != nil {
		return nil, err
	}
	c.q, c.done = q, done
	return q, nil
}

func (c *cliQueue) close() {
	if c.done != nil {
		c.done()
	}
}

// stats reads the queue's figures, warning on stderr when none of its
// parts exists: a misspelt name would otherwise read as an empty queue.
func (c *cliQueue) stats(ctx context.Context, stderr io.Writer) (queue.Queue, queue.Stats, error) {
	q, err := c.queue(ctx)
	if err != nil {
		return nil, queue.Stats{}, err
	}
	s, err := q.Stats(ctx)
	if err != nil {
		return q, s, err
	}
	if !s.Found {
		n := q.Names()
		var parts []string
		for _, p := range []string{n.Jobs, n.Delayed, n.DLQ, n.Stats} {
			if p != "" {
				parts = append(parts, p)
			}
		}
		fmt.Fprintf(stderr, "backstop: warning: no queue %q in this %s (none of %s exists): check --queue and %s\n",
			q.Name(), c.kind.name, strings.Join(parts, ", "), c.kind.urlFlag)
	}
	return q, s, nil
}

// preflight runs before a move of dead letters with reason ("" = any): a
// queue that does not exist is an error or a warning (as its broker reads
// it), and so is a reason the queue's counters have never seen.
func (c *cliQueue) preflight(ctx context.Context, reason string, stderr io.Writer) error {
	q, s, err := c.stats(ctx, stderr)
	if err != nil || reason == "" || s.Counters == nil || s.Counters["dead_letters:"+reason] > 0 {
		return err
	}
	var seen []string
	for k := range s.Counters {
		if r, ok := strings.CutPrefix(k, "dead_letters:"); ok {
			seen = append(seen, r)
		}
	}
	slices.Sort(seen)
	fmt.Fprintf(stderr, "backstop: warning: queue %s has no dead letters with reason %q (its reasons: %s)\n",
		q.Name(), reason, strings.Join(append(seen, "none")[:max(1, len(seen))], ", "))
	return nil
}

// printStats prints queue stats: the figures its broker has, its own way
// (the same --json as the broker's package returns).
func printStats(w io.Writer, name string, s queue.Stats, jsonOut bool) error {
	if jsonOut {
		return json.NewEncoder(w).Encode(s.Raw)
	}
	switch r := s.Raw.(type) {
	case redisqueue.Stats:
		fmt.Fprintf(w, "queue %s: %d jobs (%d pending), %d delayed, %d dead letters\n", name, r.Jobs, r.Pending, r.Delayed, r.DLQ)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, row := range statsRows(r.Counters) {
			fmt.Fprintf(tw, "  %s\t%s\n", row[0], row[1])
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		return printTypeStats(w, r.Types)
	case rabbitmq.Stats:
		fmt.Fprintf(w, "queue %s: %d jobs (%s unacked), %d dead letters\n", name, s.Jobs, orUnknown(r.Unacked), r.DLQ)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "  ready\t%d\n", r.Ready)
		fmt.Fprintf(tw, "  consumers\t%d\n", r.Consumers)
		fmt.Fprintf(tw, "  delay levels\t%d\t(delayed jobs of every queue of the vhost: RabbitMQ counts no delayed jobs per queue)\n", r.DelayLevels)
		tw.Flush()
		if r.Unacked == nil {
			fmt.Fprintln(w, "  (unacked comes from the management API: --rabbitmq.management-url)")
		}
		return nil
	}
	// A broker the CLI has no lines of its own for: the shared figures.
	fmt.Fprintf(w, "queue %s: %d jobs (%s held), %s delayed, %d dead letters\n", name, s.Jobs, orUnknown(s.Held), orUnknown(s.Delayed), s.DeadLetters)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, row := range statsRows(s.Counters) {
		fmt.Fprintf(tw, "  %s\t%s\n", row[0], row[1])
	}
	return tw.Flush()
}
