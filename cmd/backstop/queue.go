package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/queue"
)

// queueFlags are the flags every queue command takes.
type queueFlags struct {
	fs      *flag.FlagSet
	url     *string
	cluster *string
	name    *string
	group   *string
	jsonOut *bool
}

func newQueueFlags(name string) *queueFlags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	return &queueFlags{
		fs:      fs,
		url:     fs.String("redis-url", envOr("BACKSTOP_REDIS_URL", "redis://127.0.0.1:6379/0"), "Redis URL (env BACKSTOP_REDIS_URL)"),
		cluster: fs.String("redis-cluster", os.Getenv("BACKSTOP_REDIS_CLUSTER"), "comma-separated Redis Cluster addresses, instead of --redis-url (env BACKSTOP_REDIS_CLUSTER)"),
		name:    fs.String("queue", "", "queue name (keys {NAME}:jobs, {NAME}:delayed, {NAME}:dlq, {NAME}:stats)"),
		group:   fs.String("group", "workers", "consumer group"),
		jsonOut: fs.Bool("json", false, "print JSON"),
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func (f *queueFlags) open(args []string) (*queue.Queue, func(), error) {
	if err := f.fs.Parse(args); err != nil || f.fs.NArg() != 0 || *f.name == "" {
		return nil, nil, fmt.Errorf("%w: --queue is required", errUsage)
	}
	var rdb redis.UniversalClient
	if *f.cluster != "" {
		rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(*f.cluster, ",")})
	} else {
		opt, err := redis.ParseURL(*f.url)
		if err != nil {
			return nil, nil, fmt.Errorf("--redis-url: %w", err)
		}
		rdb = redis.NewClient(opt)
	}
	return queue.New(rdb, *f.name, queue.WithGroup(*f.group)), func() { rdb.Close() }, nil
}

func queueStats(ctx context.Context, args []string, stdout io.Writer) error {
	f := newQueueFlags("queue stats")
	q, done, err := f.open(args)
	if err != nil {
		return err
	}
	defer done()
	s, err := q.Stats(ctx)
	if err != nil {
		return err
	}
	if *f.jsonOut {
		return json.NewEncoder(stdout).Encode(s)
	}
	fmt.Fprintf(stdout, "queue %s: %d jobs (%d pending), %d delayed, %d dead letters\n", q.Name(), s.Jobs, s.Pending, s.Delayed, s.DLQ)
	keys := make([]string, 0, len(s.Counters))
	for k := range s.Counters {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	for _, k := range keys {
		fmt.Fprintf(tw, "  %s\t%d\n", k, s.Counters[k])
	}
	return tw.Flush()
}

// maxNewest bounds dlq inspect --newest: a table longer than anyone reads,
// and one reply (XREVRANGE COUNT) that stays small however large the DLQ.
const maxNewest = 1000

func dlqInspect(ctx context.Context, args []string, stdout io.Writer) error {
	f := newQueueFlags("dlq inspect")
	newest := f.fs.Int("newest", 10, fmt.Sprintf("show the newest N dead letters (0..%d)", maxNewest))
	scan := f.fs.Int64("scan", 100_000, "count reasons over at most this many entries, read 1000 at a time")
	q, done, err := f.open(args)
	if err != nil {
		return err
	}
	defer done()
	// The newest come in one reply, each with all its fields: bound them.
	// The scan reads in pages and keeps only a count per reason.
	if *newest < 0 || *newest > maxNewest {
		return fmt.Errorf("--newest: must be in 0..%d (got %d)", maxNewest, *newest)
	}
	if *scan < 0 {
		return fmt.Errorf("--scan: must be >= 0 (got %d)", *scan)
	}
	r, err := q.InspectDLQ(ctx, *newest, *scan)
	if err != nil {
		return err
	}
	if *f.jsonOut {
		return json.NewEncoder(stdout).Encode(r)
	}
	fmt.Fprintf(stdout, "queue %s: %d dead letters", q.Name(), r.Size)
	if r.Scanned < r.Size {
		fmt.Fprintf(stdout, " (reasons counted over the oldest %d)", r.Scanned)
	}
	fmt.Fprintln(stdout)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	for _, reason := range r.Reasons() {
		fmt.Fprintf(tw, "  %s\t%d\n", reason, r.ByReason[reason])
	}
	tw.Flush()
	if len(r.Newest) > 0 {
		fmt.Fprintln(stdout, "\nnewest:")
		tw = tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  entry\tjob\tattempt\treason\terror")
		for _, d := range r.Newest {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", d.EntryID, d.JobID, d.Attempt, d.Reason, oneLine(d.Error, 80))
		}
		tw.Flush()
	}
	return nil
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		return s[:n-1] + "…"
	}
	return s
}

func dlqReplay(ctx context.Context, args []string, stdout io.Writer) error {
	f := newQueueFlags("dlq replay")
	limit := f.fs.Int("limit", 0, "replay at most N dead letters (required), moved 1000 at a time")
	reason := f.fs.String("reason", "", "replay only dead letters with this reason")
	q, done, err := f.open(args)
	if err != nil {
		return err
	}
	defer done()
	if *limit < 1 {
		return fmt.Errorf("%w: --limit must be >= 1", errUsage)
	}
	n, err := q.Replay(ctx, *limit, *reason)
	fmt.Fprintf(stdout, "replayed %d dead letters of queue %s to %s\n", n, q.Name(), q.Keys().Jobs)
	return err
}
