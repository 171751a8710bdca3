package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/redact"
	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// queueFlags are the flags every queue command takes.
type queueFlags struct {
	fs      *flag.FlagSet
	url     *string
	cluster *string
	name    *string
	group   *string
	jsonOut *bool
	rabbit  rabbitFlags           // --amqp.url: RabbitMQ instead of Redis
	rdb     redis.UniversalClient // set by open
}

func newQueueFlags(name string) *queueFlags {
	fs := newFlagSet(name)
	f := &queueFlags{
		fs:      fs,
		url:     fs.String("redis.url", envOr("BACKSTOP_REDIS_URL", "redis://127.0.0.1:6379/0"), "Redis URL (env BACKSTOP_REDIS_URL)"),
		cluster: fs.String("redis.cluster", os.Getenv("BACKSTOP_REDIS_CLUSTER"), "comma-separated Redis Cluster addresses, instead of --redis.url (env BACKSTOP_REDIS_CLUSTER)"),
		name:    fs.String("queue", "", "queue name (keys {NAME}:jobs, {NAME}:delayed, {NAME}:dlq, {NAME}:stats)"),
		group:   fs.String("group", "workers", "consumer group"),
		jsonOut: fs.Bool("json", false, "print JSON"),
	}
	f.rabbit = addRabbitFlags(fs)
	renamed(fs, "redis-url", "redis.url")
	renamed(fs, "redis-cluster", "redis.cluster")
	renamed(fs, "amqp-url", "amqp.url")
	renamed(fs, "management-url", "rabbitmq.management-url")
	return f
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// openRedis parses args and returns the Redis they name as a broker, its
// queues in the consumer group --group.
func (f *queueFlags) openRedis(args []string) (*redisqueue.Broker, func(), error) {
	rdb, err := f.redisClient(args)
	if err != nil {
		return nil, nil, err
	}
	b := redisqueue.NewBroker(rdb, redisqueue.WithQueueOptions(redisqueue.WithGroup(*f.group)))
	return b, func() { b.Close() }, nil
}

// redisClient parses args and returns the client of the Redis they name.
func (f *queueFlags) redisClient(args []string) (redis.UniversalClient, error) {
	if _, err := parseFlags(f.fs, args); err != nil {
		return nil, err
	}
	if *f.name == "" {
		return nil, fmt.Errorf("%w: --queue is required", errUsage)
	}
	var rdb redis.UniversalClient
	var addrs []string
	flagName := "--redis.url or BACKSTOP_REDIS_URL"
	redis.SetLogger(quietRedis{})
	if *f.cluster != "" {
		addrs = strings.Split(*f.cluster, ",")
		flagName = "--redis.cluster or BACKSTOP_REDIS_CLUSTER"
		rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	} else {
		opt, err := redis.ParseURL(*f.url)
		if err != nil {
			return nil, fmt.Errorf("--redis.url: %w", redact.Error(err, *f.url))
		}
		addrs = []string{opt.Addr}
		rdb = redis.NewClient(opt)
	}
	// An unreachable Redis is one clear error at the first command, not
	// the client's retries of it.
	rdb.AddHook(&reachHook{addrs: addrs, flagName: flagName})
	return rdb, nil
}

func queueStats(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newQueueFlags("queue stats")
	b, err := f.broker(args)
	if err != nil {
		return err
	}
	defer b.close()
	q, s, err := b.stats(ctx, stderr)
	if err != nil {
		return err
	}
	return printStats(stdout, q.Name(), s, *f.jsonOut)
}

// maxNewest bounds dlq inspect --newest: a table longer than anyone reads,
// and one reply (XREVRANGE COUNT) that stays small however large the DLQ.
const maxNewest = 1000

func dlqInspect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newQueueFlags("dlq inspect")
	newest := f.fs.Int("newest", 10, fmt.Sprintf("show the newest N dead letters (0..%d)", maxNewest))
	scan := f.fs.Int64("scan", 100_000, "count reasons over at most this many entries, read 1000 at a time (with --amqp.url: default 1000, at most 100000)")
	b, err := f.broker(args)
	if err != nil {
		return err
	}
	defer b.close()
	// The listed ones come in one reply, each with all its fields: bound
	// them. The scan reads in pages and keeps only a count per reason.
	if *newest < 0 || *newest > maxNewest {
		return fmt.Errorf("--newest: must be in 0..%d (got %d)", maxNewest, *newest)
	}
	if *scan < 0 {
		return fmt.Errorf("--scan: must be >= 0 (got %d)", *scan)
	}
	scanSet := false
	f.fs.Visit(func(fl *flag.Flag) { scanSet = scanSet || fl.Name == "scan" })
	if !scanSet {
		*scan = queue.ScanDefault
	}
	q, err := b.queue(ctx)
	if err != nil {
		return err
	}
	rep, err := q.Inspect(ctx, queue.InspectOptions{Letters: *newest, Scan: *scan})
	if err != nil {
		return err
	}
	if rep.Size == 0 {
		if _, _, err := b.stats(ctx, stderr); err != nil { // a misspelt queue: warned of
			return err
		}
	}
	if *f.jsonOut {
		return json.NewEncoder(stdout).Encode(rep.Raw)
	}
	printDLQSummary(stdout, q.Name(), rep)
	if len(rep.Letters) == 0 {
		return nil
	}
	// Redis lists the newest, with their entry ids; RabbitMQ the oldest
	// (a queue is read from its head).
	entries := rep.Letters[0].EntryID != ""
	fmt.Fprintln(stdout, map[bool]string{true: "\nnewest:", false: "\noldest:"}[rep.Newest])
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	head := "  job\ttype\tattempt\treason\terror"
	if entries {
		head = "  entry\tjob\ttype\tattempt\treason\terror"
	}
	fmt.Fprintln(tw, head)
	for _, d := range rep.Letters {
		if entries {
			fmt.Fprintf(tw, "  %s\t", d.EntryID)
		} else {
			fmt.Fprint(tw, "  ")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", d.JobID, showType(d.Type), d.Attempt, d.Reason, oneLine(d.Error, 80))
	}
	return tw.Flush()
}

// printDLQSummary prints dlq inspect's first lines: the size, and the
// dead letters by reason (Redis and RabbitMQ alike).
func printDLQSummary(w io.Writer, name string, r queue.DLQReport) {
	fmt.Fprintf(w, "queue %s: %d dead letters", name, r.Size)
	if r.Scanned < r.Size {
		fmt.Fprintf(w, " (reasons counted over the oldest %d)", r.Scanned)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, reason := range r.Reasons() {
		fmt.Fprintf(tw, "  %s\t%d\n", reason, r.ByReason[reason])
	}
	tw.Flush()
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		return s[:n-1] + "…"
	}
	return s
}

func dlqReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newQueueFlags("dlq replay")
	limit := f.fs.Int("limit", 0, "replay at most N dead letters (required, unless --id), moved 1000 at a time")
	reason := f.fs.String("reason", "", "replay only dead letters with this reason")
	keep := f.fs.Bool("keep-attempts", false, "keep each dead letter's attempt count and first-enqueued time (default: reset, as after a fix)")
	jobType := f.fs.String("type", "", "replay only dead letters of this job type")
	id := f.fs.String("id", "", "replay only the dead letters of this job id (every one, unless --limit)")
	rateFlag := f.fs.String("rate", "", "pace the replay: at most N dead letters a second (N/s; also N/m, N/h), in batches")
	b, err := f.broker(args)
	if err != nil {
		return err
	}
	defer b.close()
	if *limit < 1 && !(*id != "" && *limit == 0) {
		return fmt.Errorf("%w: --limit must be >= 1 (or left out with --id)", errUsage)
	}
	rate, err := parseRateFlag(*rateFlag)
	if err != nil {
		return err
	}
	if *jobType != "" {
		if err := queue.ValidJobType(*jobType); err != nil {
			return fmt.Errorf("%w: --type: %v", errUsage, err)
		}
	}
	if err := b.preflight(ctx, *reason, stderr); err != nil {
		return err
	}
	q, err := b.queue(ctx)
	if err != nil {
		return err
	}
	n, err := q.Replay(ctx, queue.ReplayOptions{Limit: *limit, Reason: *reason, JobType: *jobType, ID: *id,
		KeepAttempts: *keep, Rate: rate, Actor: actor()}) // each one recorded in the audit
	attempts := "attempt count reset"
	if *keep {
		attempts = "attempt count kept"
	}
	w := q.Names()
	fmt.Fprintf(stdout, "replayed %d dead letters of queue %s to %s (%s)\n", n, q.Name(), w.Jobs, attempts)
	if err == nil && *id != "" && n == 0 {
		// An exit status a script can test: the job was not moved.
		return fmt.Errorf("queue %s: no dead letter of job %q in %s that can be replayed, nothing moved", q.Name(), *id, w.DLQ)
	}
	return err
}

func parseRateFlag(s string) (float64, error) {
	if s == "" {
		return 0, nil
	}
	r, err := queue.ParseRate(s)
	if err != nil {
		return 0, fmt.Errorf("%w: --rate: %v", errUsage, err)
	}
	return r, nil
}

// actor is who runs the command, for the audit records: user@host.
func actor() string {
	name := os.Getenv("USER")
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	if name == "" {
		name = "unknown"
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	a := name + "@" + host
	if len(a) > queue.MaxActorLen {
		a = a[:queue.MaxActorLen]
	}
	return a
}

// discardFlags are the flags of dlq delete and dlq purge.
type discardFlags struct {
	*queueFlags
	action                    queue.DiscardAction
	id, note, reason, jobType *string
	limit                     *int
}

func newDiscardFlags(action queue.DiscardAction) *discardFlags {
	f := &discardFlags{queueFlags: newQueueFlags("dlq " + string(action)), action: action}
	f.note = f.fs.String("reason", "", fmt.Sprintf("why, recorded with each discarded dead letter in the audit (required, 1..%d bytes)", queue.MaxNoteLen))
	if action == queue.DiscardDelete {
		f.id = f.fs.String("id", "", "the job id whose dead letters are discarded (required)")
		empty, zero := "", 0
		f.reason, f.jobType, f.limit = &empty, &empty, &zero
	} else {
		empty := ""
		f.id = &empty
		f.reason = f.fs.String("dead-letter-reason", "", "discard only dead letters with this reason (crash_loop, malformed, unroutable, ...)")
		f.jobType = f.fs.String("type", "", "discard only dead letters of this job type")
		f.limit = f.fs.Int("limit", 0, "discard at most N dead letters (default: every one that matches)")
	}
	return f
}

func (f *discardFlags) check() error {
	switch {
	case f.action == queue.DiscardDelete && *f.id == "":
		return fmt.Errorf("%w: --id is required", errUsage)
	case *f.note == "":
		return fmt.Errorf("%w: --reason is required: why the dead letters are discarded, kept in the audit", errUsage)
	case len(*f.note) > queue.MaxNoteLen:
		return fmt.Errorf("%w: --reason must be at most %d bytes, got %d", errUsage, queue.MaxNoteLen, len(*f.note))
	case *f.limit < 0:
		return fmt.Errorf("%w: --limit must be >= 1 (or left out: every one)", errUsage)
	}
	if *f.jobType != "" {
		if err := queue.ValidJobType(*f.jobType); err != nil {
			return fmt.Errorf("%w: --type: %v", errUsage, err)
		}
	}
	return nil
}

func dlqDelete(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return dlqDiscard(ctx, newDiscardFlags(queue.DiscardDelete), args, stdout, stderr)
}

func dlqPurge(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return dlqDiscard(ctx, newDiscardFlags(queue.DiscardPurge), args, stdout, stderr)
}

// dlqDiscard is dlq delete and dlq purge: dead letters removed for good,
// each recorded first in the audit stream (or queue) and counted.
func dlqDiscard(ctx context.Context, f *discardFlags, args []string, stdout, stderr io.Writer) error {
	b, err := f.broker(args)
	if err != nil {
		return err
	}
	defer b.close()
	if err := f.check(); err != nil {
		return err
	}
	if err := b.preflight(ctx, *f.reason, stderr); err != nil {
		return err
	}
	q, err := b.queue(ctx)
	if err != nil {
		return err
	}
	n, err := q.Discard(ctx, queue.DiscardOptions{Action: f.action, ID: *f.id, Reason: *f.reason, JobType: *f.jobType,
		Limit: *f.limit, Note: *f.note, Actor: actor()})
	w := q.Names()
	if *f.jsonOut {
		if jerr := json.NewEncoder(stdout).Encode(map[string]any{"queue": q.Name(), "discarded": n, "audit": w.Audit}); jerr != nil && err == nil {
			err = jerr
		}
	} else {
		fmt.Fprintf(stdout, "discarded %d dead letters of queue %s (recorded in %s)\n", n, q.Name(), w.Audit)
	}
	if err == nil && f.action == queue.DiscardDelete && n == 0 {
		return fmt.Errorf("queue %s: no dead letter of job %q in %s, nothing discarded", q.Name(), *f.id, w.DLQ)
	}
	return err
}

// queueRun moves delayed jobs to the jobs stream now: one by job id, or
// those due before a time in a bounded batch (Cloud Tasks' RunTask).
func queueRun(ctx context.Context, args []string, stdout io.Writer) error {
	f := newQueueFlags("queue run")
	id := f.fs.String("id", "", "run the delayed job with this job id now")
	before := f.fs.String("all-due-before", "", `run the delayed jobs due before this time now: RFC 3339 ("2026-12-01T14:00:00Z") or "now"`)
	limit := f.fs.Int("limit", 0, fmt.Sprintf("with --all-due-before: run at most N jobs, 1..%d (required)", queue.MaxRunLimit))
	b, err := f.broker(args)
	if err != nil {
		return err
	}
	defer b.close()
	o := queue.RunOptions{Actor: actor()} // each job moved recorded in the audit
	switch {
	case (*id == "") == (*before == ""):
		return fmt.Errorf("%w: give --id or --all-due-before, one of them", errUsage)
	case *id != "":
		if *limit != 0 {
			return fmt.Errorf("%w: --limit goes with --all-due-before, not --id", errUsage)
		}
		o.ID = *id
	default:
		t := time.Now()
		if *before != "now" {
			if t, err = time.Parse(time.RFC3339Nano, *before); err != nil {
				return fmt.Errorf("%w: --all-due-before must be an RFC 3339 time or \"now\", got %q", errUsage, *before)
			}
		}
		if *limit < 1 || *limit > queue.MaxRunLimit {
			return fmt.Errorf("%w: --limit must be in 1..%d with --all-due-before, got %d", errUsage, queue.MaxRunLimit, *limit)
		}
		o.DueBefore, o.Limit = t, *limit
	}
	q, err := b.queue(ctx)
	if err != nil {
		return err
	}
	r, err := q.Run(ctx, o)
	if err != nil {
		return err
	}
	if *f.jsonOut {
		if err := json.NewEncoder(stdout).Encode(map[string]any{"queue": q.Name(), "moved": r.Moved, "left": r.Left}); err != nil {
			return err
		}
	}
	w := q.Names()
	switch {
	case *id != "" && r.Moved == 0:
		// An exit status a script can test: the job was not moved.
		return fmt.Errorf("queue %s: no delayed job with id %q in %s, nothing moved (is it in the jobs stream or the DLQ already? backstop queue stats --queue %s)", q.Name(), *id, w.Delayed, q.Name())
	case *f.jsonOut:
	case *id != "":
		fmt.Fprintf(stdout, "moved job %q of queue %s from %s to %s\n", *id, q.Name(), w.Delayed, w.Jobs)
	default:
		fmt.Fprintf(stdout, "moved %d delayed jobs of queue %s to %s; %d more due before %s\n", r.Moved, q.Name(), w.Jobs, r.Left, *before)
	}
	return nil
}
