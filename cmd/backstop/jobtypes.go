package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"text/tabwriter"

	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// queueEnqueue adds one job, typed or not: for scripts, and to try a
// worker by hand.
func queueEnqueue(ctx context.Context, args []string, stdout io.Writer) error {
	f := newQueueFlags("queue enqueue")
	id := f.fs.String("id", "", "the job's stable id, its idempotency key (required)")
	payload := f.fs.String("payload", "", `the job's payload; "-" reads it from stdin`)
	jobType := f.fs.String("type", "", "the job type, 1..64 of [A-Za-z0-9_./-] (default: untyped)")
	b, err := f.broker(args)
	if err != nil {
		return err
	}
	defer b.close()
	if *id == "" {
		return fmt.Errorf("%w: --id is required", errUsage)
	}
	if *jobType != "" {
		if err := queue.ValidJobType(*jobType); err != nil {
			return fmt.Errorf("%w: --type: %v", errUsage, err)
		}
	}
	body := []byte(*payload)
	if *payload == "-" {
		if body, err = io.ReadAll(os.Stdin); err != nil {
			return fmt.Errorf("--payload -: %w", err)
		}
	}
	q, err := b.queue(ctx)
	if err != nil {
		return err
	}
	entry, err := q.Enqueue(ctx, *id, body, queue.EnqueueOptions{Type: *jobType})
	if err != nil {
		return err
	}
	if *f.jsonOut {
		return json.NewEncoder(stdout).Encode(map[string]any{"queue": q.Name(), "entry_id": entry, "id": *id, "type": *jobType})
	}
	fmt.Fprintf(stdout, "enqueued job %q (type %s) to %s", *id, showType(*jobType), q.Names().Jobs)
	if entry != "" { // RabbitMQ gives a message no id of its own
		fmt.Fprintf(stdout, " as entry %s", entry)
	}
	fmt.Fprintln(stdout)
	return nil
}

// queueTypes shows the job types a queue counts by name, and sets how many
// it may (--limit).
func queueTypes(ctx context.Context, args []string, stdout io.Writer) error {
	f := newQueueFlags("queue types")
	limit := f.fs.Int("limit", 0, fmt.Sprintf("set how many job types the queue counts by name; the others count as \"other\" (default of a queue: %d)", redisqueue.DefaultTypeLimit))
	b, err := f.broker(args)
	if err != nil {
		return err
	}
	defer b.close()
	raw, ok := b.q.(interface{ Redis() *redisqueue.Queue })
	if !ok {
		return queue.Unsupported(b.kind.kind, *f.name, "job types", "RabbitMQ keeps no counters: its workers export them per job type (rabbitmq.WithMetrics)")
	}
	q := raw.Redis()
	limitSet := false
	f.fs.Visit(func(fl *flag.Flag) { limitSet = limitSet || fl.Name == "limit" })
	if limitSet {
		if *limit < 1 {
			return fmt.Errorf("%w: --limit must be >= 1, got %d", errUsage, *limit)
		}
		if err := q.SetTypeLimit(ctx, *limit); err != nil {
			return err
		}
	}
	s, err := q.Stats(ctx)
	if err != nil {
		return err
	}
	if *f.jsonOut {
		return json.NewEncoder(stdout).Encode(s.Types)
	}
	return printTypeStats(stdout, s.Types)
}

// printTypeStats prints the per-type figures: attempts by outcome, retries,
// dead letters, per job type.
func printTypeStats(w io.Writer, ts redisqueue.TypeStats) error {
	fmt.Fprintf(w, "job types: %d counted by name (limit %d), %d events counted as other past the limit\n",
		ts.Registered, ts.Limit, ts.Overflow)
	if len(ts.ByType) == 0 {
		return nil
	}
	types := make([]string, 0, len(ts.ByType))
	for t := range ts.ByType {
		types = append(types, t)
	}
	sort.Strings(types)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  type\tsuccess\tretry\tdeferred\tdead_letter\tmax_attempts_reached\tmean attempts")
	for _, t := range types {
		c := ts.ByType[t]
		fin := c["finished_sum:success"] + c["finished_sum:dead_letter"]
		n := c["attempts:success"] + c["attempts:dead_letter"]
		mean := "-"
		if n > 0 {
			mean = strconv.FormatFloat(float64(fin)/float64(n), 'f', 2, 64)
		}
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\t%d\t%d\t%s\n", t, c["attempts:success"], c["attempts:retry"], c["attempts:deferred"],
			c["attempts:dead_letter"], c["max_attempts_reached"], mean)
	}
	return tw.Flush()
}

// showType prints a job type: "-" when untyped, quoted when not valid.
func showType(t string) string {
	switch {
	case t == "":
		return "-"
	case queue.ValidJobType(t) != nil:
		return strconv.Quote(t)
	}
	return t
}
