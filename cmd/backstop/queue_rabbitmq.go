package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"text/tabwriter"

	"github.com/backstop-dev/backstop/internal/redact"
	"github.com/backstop-dev/backstop/queue/rabbitmq"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// rabbitFlags are what the queue commands take for RabbitMQ, the
// alternative to Redis: --amqp.url (env BACKSTOP_AMQP_URL) and, for the
// figures only the management API has, --rabbitmq.management-url.
type rabbitFlags struct {
	amqp *string
	mgmt *string
}

func addRabbitFlags(fs *flag.FlagSet) rabbitFlags {
	return rabbitFlags{
		amqp: fs.String("amqp.url", os.Getenv("BACKSTOP_AMQP_URL"), "RabbitMQ AMQP URL, instead of Redis: amqp://user:password@host:5672/vhost (env BACKSTOP_AMQP_URL)"),
		mgmt: fs.String("rabbitmq.management-url", os.Getenv("BACKSTOP_RABBITMQ_MANAGEMENT_URL"), "with --amqp.url: the management API, http://user:password@host:15672, for the unacked count (env BACKSTOP_RABBITMQ_MANAGEMENT_URL)"),
	}
}

// useRabbit parses args and reports whether the command runs against
// RabbitMQ: --amqp.url given, or BACKSTOP_AMQP_URL set and no Redis flag.
// A flag wins over the environment; two brokers named the same way are a
// usage error. A parse error is left for open to report.
func (f *queueFlags) useRabbit(args []string) (bool, error) {
	if f.fs.Parse(args) != nil {
		return false, nil
	}
	set := map[string]bool{}
	f.fs.Visit(func(fl *flag.Flag) { set[flagName(fl)] = true })
	redisFlag := set["redis.url"] || set["redis.cluster"]
	switch {
	case set["amqp.url"] && redisFlag:
		return false, fmt.Errorf("%w: give --amqp.url or --redis.url/--redis.cluster, not both", errUsage)
	case set["amqp.url"]:
		if *f.rabbit.amqp == "" {
			return false, fmt.Errorf("%w: --amqp.url is empty", errUsage)
		}
		return true, nil
	case redisFlag || *f.rabbit.amqp == "":
		return false, nil
	case os.Getenv("BACKSTOP_REDIS_URL") != "" || os.Getenv("BACKSTOP_REDIS_CLUSTER") != "":
		return false, fmt.Errorf("%w: BACKSTOP_AMQP_URL and BACKSTOP_REDIS_URL (or _CLUSTER) are both set: choose with --amqp.url or --redis.url", errUsage)
	}
	return true, nil
}

// openRabbit connects to RabbitMQ for a queue command.
func (f *queueFlags) openRabbit(ctx context.Context) (*rabbitmq.Queue, func(), error) {
	if *f.name == "" {
		return nil, nil, fmt.Errorf("%w: --queue is required", errUsage)
	}
	var redisOnly error
	f.fs.Visit(func(fl *flag.Flag) {
		if fl.Name == "group" {
			redisOnly = fmt.Errorf("%w: --group is a Redis consumer group; RabbitMQ has none (drop it with --amqp.url)", errUsage)
		}
	})
	if redisOnly != nil {
		return nil, nil, redisOnly
	}
	u, err := url.Parse(*f.rabbit.amqp)
	if err != nil {
		return nil, nil, fmt.Errorf("--amqp.url: %w", redact.Error(err, *f.rabbit.amqp))
	}
	if u.Scheme != "amqp" && u.Scheme != "amqps" {
		return nil, nil, fmt.Errorf("--amqp.url: want amqp://user:password@host:5672/vhost or amqps://…, got %q", redact.URL(*f.rabbit.amqp))
	}
	b, err := rabbitmq.Open(ctx, *f.rabbit.amqp, rabbitmq.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		// One clear line, as for Redis: where, why, what to check.
		return nil, nil, fmt.Errorf("cannot reach RabbitMQ at %s: %w (check --amqp.url or BACKSTOP_AMQP_URL)", u.Host, errors.Unwrap(err))
	}
	return b.Queue(*f.name), func() { b.Close() }, nil
}

func (f *queueFlags) rabbitStatsOptions() []rabbitmq.StatsOption {
	if *f.rabbit.mgmt == "" {
		return nil
	}
	return []rabbitmq.StatsOption{rabbitmq.WithManagementAPI(*f.rabbit.mgmt, nil)}
}

// orUnknown prints a figure only the management API gives.
func orUnknown(n *int64) string {
	if n == nil {
		return "?"
	}
	return strconv.FormatInt(*n, 10)
}

func (r *rabbitCLI) stats(ctx context.Context, stdout, _ io.Writer) error {
	if err := r.connect(ctx); err != nil {
		return err
	}
	q, f := r.q, r.f
	s, err := q.Stats(ctx, f.rabbitStatsOptions()...)
	if err != nil {
		return err
	}
	if *f.jsonOut {
		return json.NewEncoder(stdout).Encode(s)
	}
	// The Redis line's columns: jobs counts those a worker holds too.
	jobs := s.Ready
	if s.Unacked != nil {
		jobs += *s.Unacked
	}
	fmt.Fprintf(stdout, "queue %s: %d jobs (%s unacked), %d dead letters\n", q.Name(), jobs, orUnknown(s.Unacked), s.DLQ)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "  ready\t%d\n", s.Ready)
	fmt.Fprintf(tw, "  consumers\t%d\n", s.Consumers)
	fmt.Fprintf(tw, "  delay levels\t%d\t(delayed jobs of every queue of the vhost: RabbitMQ counts no delayed jobs per queue)\n", s.DelayLevels)
	tw.Flush()
	if s.Unacked == nil {
		fmt.Fprintln(stdout, "  (unacked comes from the management API: --rabbitmq.management-url)")
	}
	return nil
}

// maxRabbitPeek bounds dlq inspect --scan with --amqp.url: a peek holds
// every message it looks at until it has counted them all.
const maxRabbitPeek = 100_000

// rabbitInspectReport is dlq inspect --json with --amqp.url: the Redis
// report's keys, with the oldest dead letters (a queue is read from its head).
type rabbitInspectReport struct {
	Size     int64                 `json:"size"`
	Scanned  int64                 `json:"scanned"`
	ByReason map[string]int64      `json:"by_reason"`
	Oldest   []rabbitmq.DeadLetter `json:"oldest"`
}

func (r *rabbitCLI) inspect(ctx context.Context, newest int, scan int64, stdout, _ io.Writer) error {
	f := r.f
	if newest < 0 || newest > maxNewest {
		return fmt.Errorf("--newest: must be in 0..%d (got %d)", maxNewest, newest)
	}
	if scan < 0 || scan > maxRabbitPeek {
		return fmt.Errorf("--scan: must be in 0..%d with --amqp.url (got %d)", maxRabbitPeek, scan)
	}
	scanSet := false
	f.fs.Visit(func(fl *flag.Flag) { scanSet = scanSet || fl.Name == "scan" })
	if !scanSet {
		scan = 1000 // each one is a round trip (basic.get): a default that answers at once
	}
	if err := r.connect(ctx); err != nil {
		return err
	}
	q := r.q
	s, err := q.Stats(ctx)
	if err != nil {
		return err
	}
	dls, err := q.Inspect(ctx, int(max(scan, int64(newest))))
	if err != nil {
		return err
	}
	rep := rabbitInspectReport{Size: s.DLQ, Scanned: int64(len(dls)), ByReason: map[string]int64{}}
	for _, d := range dls {
		rep.ByReason[d.Reason]++
	}
	rep.Oldest = dls[:min(newest, len(dls))]
	if *f.jsonOut {
		return json.NewEncoder(stdout).Encode(rep)
	}
	printDLQSummary(stdout, q.Name(), redisqueue.DLQReport{Size: rep.Size, Scanned: rep.Scanned, ByReason: rep.ByReason})
	if len(rep.Oldest) > 0 {
		fmt.Fprintln(stdout, "\noldest:")
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  job\ttype\tattempt\treason\terror")
		for _, d := range rep.Oldest {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", d.JobID, showType(d.JobType), d.Attempt, d.Reason, oneLine(d.Error, 80))
		}
		tw.Flush()
	}
	return nil
}
