// Package exporter is backstop's Prometheus collector. It reads the queues
// of the queue contract (delayed set, dead letter stream, jobs stream and
// its consumer groups, stats hash) and reports the metrics of DESIGN.md,
// "Metrics (exporter contract)". It never writes to Redis.
// NewRabbitMQCollector reports the same names for queues on RabbitMQ, from
// its management API (rabbitmq.go).
//
// Every scrape reads live state in pipelines of a fixed number of
// commands per queue, whatever the queues' lengths, under a time budget;
// scrapes that arrive while one runs share its result. Every bound the
// exporter applies says in backstop_scrape_limit_reached when it was hit.
//
//	c, err := exporter.NewCollector(rdb, exporter.WithQueues(exporter.QueueFor("orders")))
//	if err != nil { … }
//	reg := prometheus.NewRegistry()
//	reg.MustRegister(c)
package exporter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors/version"
	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/resp"
)

type config struct {
	queues  []Queue
	pattern string
	refresh time.Duration
	maxKeys int
	timeout time.Duration
	log     *slog.Logger
	now     func() time.Time // the clock: a seam for tests
	rmq     *rabbitConfig    // the RabbitMQ options (rabbitmq.go); nil for Redis
	// viaClient reads the queues through the client's pipelines
	// (WithClientPipelines).
	viaClient bool
}

func defaults() config {
	return config{timeout: 5 * time.Second, log: slog.New(slog.DiscardHandler), now: time.Now}
}

// Option configures a Collector.
type Option func(*config)

// WithQueues adds queues to report. Use QueueFor for the default layout.
func WithQueues(qs ...Queue) Option {
	return func(c *config) { c.queues = append(c.queues, qs...) }
}

// WithPattern discovers queues by SCAN MATCH pattern on every master (each
// master of a Redis Cluster), taking at most maxKeys matching keys. A
// matching key names a queue when it is exactly one of the keys of the
// default layout, {Q}:jobs, {Q}:delayed, {Q}:dlq or {Q}:stats, where {Q}
// is the key's hash tag as Redis Cluster reads it (from the first '{' to
// the first '}' after it) and Q is a valid label value (UTF-8 without
// control characters): pattern "{*}:jobs" finds queue orders through the
// key {orders}:jobs, and skips {a}x}:jobs or {orders}:jobs:old. Discovered
// queues use the default layout and group (QueueFor); queues in other
// layouts are given with WithQueues, and keep their own layout when
// discovered too.
//
// The names are cached and refreshed every refresh interval, in the
// background so a scrape never waits for a SCAN except the first. A
// discovery that reaches maxKeys goes on counting the matching keys
// without taking them: backstop_discovery_keys says how many keys were
// taken, skipped and left out, and backstop_scrape_limit_reached{limit=
// "max_keys"} and backstop_scrape_partial say that queues are not read.
func WithPattern(pattern string, refresh time.Duration, maxKeys int) Option {
	return func(c *config) { c.pattern, c.refresh, c.maxKeys = pattern, refresh, maxKeys }
}

// WithTimeout sets the time budget of one scrape (default 5s). A scrape
// that runs out of it returns on time with backstop_scrape_partial 1.
//
// # Notes
//
// Over a client with ContextTimeoutEnabled the replies that arrived in
// time are still reported; over one without, go-redis ignores the budget,
// so the scrape reports no queue and drops the replies when they come.
// cmd/backstop-exporter turns it on.
func WithTimeout(d time.Duration) Option { return func(c *config) { c.timeout = d } }

// WithClientPipelines reads the queues through the client's own
// pipelines, so that its hooks (tracing, metrics) see every read. By
// default the queues of a plain, Sentinel-managed or cluster client are read
// over connections of the collector's own, dialled and logged in as the
// client's options say (one per master of a cluster) and read without
// go-redis's per-reply objects: about half the CPU per scrape
// (BENCHMARKS.md). A client with an OnConnect hook or a streaming
// credentials provider is always read through its pipelines.
func WithClientPipelines() Option { return func(c *config) { c.viaClient = true } }

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.log = l } }

// Collector reports backstop's queues and the exporter's health, build
// info included (backstop_exporter_build_info: do not register
// prometheus/collectors/version beside it). It implements
// prometheus.Collector and is safe for concurrent use; it never closes the
// client.
type Collector struct {
	src    source // where the queues are read: Redis or RabbitMQ (source.go)
	cfg    config
	build  prometheus.Collector
	flight flight

	mu      sync.Mutex
	errs    map[string]float64 // backstop_scrape_errors_total by kind
	missing map[string]bool    // the queues not found, logged once (noteFound)
}

// NewCollector returns a collector of the queues that opts name over a
// client: a plain client, a Sentinel failover client or a cluster client.
// It does not contact Redis: an unreachable Redis is reported by the
// scrapes (backstop_up 0), which reconnect on their own.
//
// # Errors
//
// No queue and no pattern, a queue without a name or given twice, a
// pattern without a hash tag, or a budget, refresh interval or key bound
// that is not positive.
func NewCollector(rdb redis.UniversalClient, opts ...Option) (*Collector, error) {
	cfg := defaults()
	for _, o := range opts {
		o(&cfg)
	}
	if rdb == nil {
		return nil, errors.New("exporter: nil redis client")
	}
	if cfg.timeout <= 0 {
		return nil, fmt.Errorf("exporter: timeout must be positive, got %v", cfg.timeout)
	}
	if cfg.log == nil {
		cfg.log = slog.New(slog.DiscardHandler)
	}
	if len(cfg.queues) == 0 && cfg.pattern == "" {
		return nil, errors.New("exporter: no queues: give WithQueues or WithPattern")
	}
	qs := make([]Queue, len(cfg.queues))
	for i, q := range cfg.queues {
		var err error
		if qs[i], err = q.withDefaults(); err != nil {
			return nil, fmt.Errorf("exporter: %w", err)
		}
	}
	if err := checkUnique(qs); err != nil {
		return nil, fmt.Errorf("exporter: %w", err)
	}
	sortQueues(qs)
	cfg.queues = qs
	c := &Collector{cfg: cfg, build: version.NewCollector("backstop_exporter"), errs: map[string]float64{}}
	src := &redisSource{rdb: rdb, tr: newTransport(rdb, cfg.viaClient), ingest: newTransport(rdb, cfg.viaClient), cfg: &c.cfg}
	if cfg.pattern != "" {
		if err := checkPattern(cfg.pattern, cfg.refresh, cfg.maxKeys); err != nil {
			return nil, fmt.Errorf("exporter: %w", err)
		}
		src.disc = &discovery{rdb: rdb, pattern: cfg.pattern, every: cfg.refresh, max: cfg.maxKeys, log: cfg.log}
	}
	c.src = src
	return c, nil
}

// newTransport picks how the collector reads the queues (internal/resp):
// connections of its own, dialled and logged in as the client's options
// say, for a plain or Sentinel-managed client and for a cluster, one per
// master; or the client's own pipelines for a client that runs code on
// connect or takes streaming credentials, any other client, or when asked
// (WithClientPipelines).
func newTransport(rdb redis.UniversalClient, viaClient bool) resp.Transport {
	if viaClient {
		return resp.NewClientTransport(rdb)
	}
	return resp.NewTransport(rdb)
}

// Ready reports whether the collector's source answers now: Redis a PING
// (a node of a cluster), RabbitMQ's management API a read of the virtual
// host, within the collector's timeout. backstop-exporter's /-/ready is
// it: an exporter whose source is unreachable serves only backstop_up 0.
func (c *Collector) Ready(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.timeout)
	defer cancel()
	return c.src.ready(ctx)
}

// Close closes the collector's own connections to Redis, if it has any;
// a scrape after Close dials anew. It never closes the client.
func (c *Collector) Close() error { return c.src.close() }

// Describe sends the descriptors of every metric the collector reports.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range descs {
		ch <- d.d
	}
	c.build.Describe(ch)
}

// Collect scrapes Redis, or waits for the scrape already running and
// reports its result.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ss := c.flight.do(c.scrape)
	ss.all(func(s *sample) { ch <- ss.metric(s) })
	c.build.Collect(ch)
}

// scrape reads every queue of the source once within the budget, and
// adds the exporter's own metrics.
func (c *Collector) scrape() *samples {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.timeout)
	defer cancel()
	s := &sink{log: c.cfg.log, kinds: map[string]error{}}
	queues := c.src.scrape(ctx, s)
	c.noteFound(s)
	return c.health(s, queues, time.Since(start))
}

// queues returns the configured and the discovered queues, by name.
func (src *redisSource) queues(ctx context.Context, s *sink) []Queue {
	if src.disc == nil {
		return src.cfg.queues // sorted by NewCollector
	}
	found, err := src.disc.names(ctx)
	if err != nil {
		s.fail(Queue{}, src.cfg.pattern, fmt.Errorf("discovery: %w", err))
	}
	var names []string
	if found != nil { // nil until the first SCAN ends
		s.found, names = found, found.names
	}
	qs := append([]Queue(nil), src.cfg.queues...)
	known := make(map[string]bool, len(qs))
	for _, q := range qs {
		known[q.Name] = true
	}
	for _, n := range names {
		if !known[n] {
			qs = append(qs, QueueFor(n))
		}
	}
	sortQueues(qs)
	return qs
}

// sortQueues orders queues by name, so the samples come out nearly in the
// order the registry sorts them to, which makes its sort cheap.
func sortQueues(qs []Queue) {
	slices.SortFunc(qs, func(a, b Queue) int { return strings.Compare(a.Name, b.Name) })
}

// batchQueues is how many queues one pipeline reads. A scrape sends its
// queues in pipelines of this many, at most two on the wire: the replies
// of a batch are garbage once turned into samples, so neither the exporter
// nor Redis (whose output buffer holds the replies of a pipeline until the
// client reads them) ever holds the replies of every queue at once. 50
// rather than 100: 1 MiB less peak RSS at 1,000 queues for 5-12% more
// scrape time and the same CPU; 100 rather than 500 before that: 5 MiB
// less (BENCHMARKS.md).
const batchQueues = 50

// read sends the queues' commands in pipelines of batchQueues queues (a
// cluster client splits each per node) and turns the replies into
// metrics, one batch on the wire while the last one is read where the
// transport allows. The budget holds even over a client that ignores
// context deadlines (resp.ClientTransport); replies that miss it are
// dropped, and the queues of the batches not sent are not reported.
func (src *redisSource) read(ctx context.Context, qs []Queue, s *sink) {
	groups := 0
	for _, q := range qs {
		groups += len(q.Groups)
	}
	totals := makeCounts()
	pl := plan{
		now: src.cfg.now(), sample: sampleSize(groups),
		heads: map[string]resp.Ref{}, stats: map[string]resp.Ref{},
		totals: &totals, names: map[string]string{},
	}
	// Batches in turn, up to resp.PipelineDepth on the wire, their replies
	// read one batch after the other into one arena, as large from the
	// start as the last scrape's grew.
	var batches [resp.PipelineDepth]batch
	arena := resp.NewReplies(src.sizes.nodes, src.sizes.buf)
	for i := range batches {
		batches[i].p.Bind(src.tr, arena)
	}
	var used struct{ nodes, buf int } // the most a batch's replies took
	abandoned := false                // a goroutine the budget left behind still writes to the arena
	defer func() {
		if !abandoned {
			src.sizes = used
		}
	}()
	queued, finished, exhausted := 0, 0, false // batches sent, batches read, all sent
	next := func() *resp.Pipe {
		start := queued * batchQueues
		if start > 0 && start >= len(qs) {
			exhausted = true
			return nil
		}
		b := &batches[queued%len(batches)] // the oldest: its replies are read
		queued++
		b.reset(start, qs[start:min(start+batchQueues, len(qs))])
		if start == 0 {
			b.ping = b.p.Do("PING") // says whether Redis is up even with no queue to read
		}
		clear(pl.heads)
		clear(pl.stats)
		for _, q := range b.queues {
			for _, r := range readers {
				if f := r(&b.p, q, pl); f != nil {
					b.reads = append(b.reads, f)
				}
			}
		}
		return &b.p
	}
	batchOf := func(p *resp.Pipe) *batch {
		for i := range batches {
			if p == &batches[i].p {
				return &batches[i]
			}
		}
		panic("exporter: a pipe of no batch")
	}
	done := func(p *resp.Pipe) bool {
		b := batchOf(p)
		finished++
		nodes, buf := arena.Size()
		used.nodes, used.buf = max(used.nodes, nodes), max(used.buf, buf)
		if b.ping != noRef {
			if err := p.Reply(b.ping).Err(); err != nil {
				s.fail(Queue{}, "", fmt.Errorf("ping: %w", err))
			} else {
				s.pinged = true
			}
		}
		// Read every reply even after a failed ping: on a cluster the other
		// nodes may have answered.
		for _, f := range b.reads {
			f(s)
		}
		return s.pinged || src.cluster() // else Redis is down: the next batches would wait for it in vain
	}
	if p := src.tr.Stream(ctx, next, done); p != nil {
		abandoned = true
		b := batchOf(p)
		s.fail(Queue{}, "", fmt.Errorf("pipeline of queues %d to %d of %d: %w", b.start+1, b.start+len(b.queues), len(qs), ctx.Err()))
		return
	}
	if (!exhausted || finished < queued) && ctx.Err() != nil {
		read := min(finished*batchQueues, len(qs))
		s.fail(Queue{}, "", fmt.Errorf("queues %d to %d of %d not read: %w", read+1, len(qs), len(qs), ctx.Err()))
		return
	}
	src.readLater(ctx, s)
}

// batch is the pipeline of batchQueues queues and what reads its replies.
type batch struct {
	p      resp.Pipe
	start  int // the index of its first queue
	queues []Queue
	ping   resp.Ref
	reads  []func(*sink)
}

func (b *batch) reset(start int, qs []Queue) {
	b.p.Clear()
	clear(b.reads)
	b.start, b.queues, b.ping, b.reads = start, qs, noRef, b.reads[:0]
}

func (src *redisSource) cluster() bool {
	_, ok := src.rdb.(*redis.ClusterClient)
	return ok
}

// readLater runs the reads the replies of the batches asked for (the
// groups of a stream not named in its configuration) in one more pipeline
// after them, under the same budget.
func (src *redisSource) readLater(ctx context.Context, s *sink) {
	if len(s.later) == 0 {
		return
	}
	later := s.later
	s.later = nil
	p := resp.NewPipe(src.tr, nil)
	reads := make([]func(*sink), 0, len(later))
	for _, r := range later {
		reads = append(reads, r(p))
	}
	if p.Exec(ctx) {
		s.fail(Queue{}, "", fmt.Errorf("pipeline of %d unconfigured consumer groups: %w", len(later), ctx.Err()))
		return
	}
	for _, f := range reads {
		f(s)
	}
}

// A reader queues the commands that read one part of a queue on the
// pipeline and returns the function that turns their replies into metrics
// once the pipeline has run, or nil when the queue has no such part.
type reader func(p *resp.Pipe, q Queue, pl plan) func(*sink)

// plan is what the readers of one scrape share.
type plan struct {
	now    time.Time // the exporter's clock: ages are measured against it
	sample int64     // XPENDING entries to read per group
	// heads and stats are the delayed sets' first members and the stats
	// hashes queued on the current pipeline, by key (delayedHead,
	// statsHash); nil reads each on its own.
	heads map[string]resp.Ref
	stats map[string]resp.Ref
	// totals is readStats's scratch for a queue's totals, reused queue
	// after queue: 5 maps less per queue. nil makes new ones.
	totals *counts
	// names holds the stats hashes' field names read so far: every queue
	// has the same ones, made into strings once a scrape. nil makes each.
	names map[string]string
}

// intern returns b as a string, the same one for the same bytes.
func (pl plan) intern(b []byte) string {
	if pl.names == nil {
		return string(b)
	}
	if s, ok := pl.names[string(b)]; ok {
		return s
	}
	s := string(b)
	pl.names[s] = s
	return s
}

var readers = []reader{readDelayed, readDLQ, readStreams, readOldestJob, readStats, readFound} // readFound last: it reads what the others saw

// sink gathers one scrape's metrics and errors.
type sink struct {
	log     *slog.Logger
	samples samples
	kinds   map[string]error // the first error of each kind
	pinged  bool             // Redis answered the scrape's PING
	limits  map[string]bool  // the limits this scrape reached, by limit label
	found   *found           // the discovery the scrape used; nil without a pattern
	// queueFound says, by queue name, whether any of its keys exists
	// (readFound, sink.seen); nil until a queue is read.
	queueFound map[string]bool
	// later are reads a reply asked for, run in a second pipeline: the
	// consumer groups XINFO GROUPS named that the configuration does not.
	later []func(*resp.Pipe) func(*sink)
	keys  []string // bounded's scratch
}

// gauge and counter add a sample of d, whose name says its type
// (desc.typ): they differ for the reader.
func (s *sink) gauge(d *desc, v float64, labels ...string) {
	s.put(d, v, nil, labels)
}

func (s *sink) counter(d *desc, v float64, labels ...string) {
	s.put(d, v, nil, labels)
}

// histogram adds a histogram of count observations summing to sum, with
// cum[i] of them at most bounds[i].
func (s *sink) histogram(d *desc, bounds []float64, cum []uint64, count uint64, sum float64, labels ...string) {
	s.put(d, sum, &hist{count: count, bounds: bounds, cum: cum}, labels)
}

func (s *sink) put(d *desc, v float64, h *hist, labels []string) {
	m := s.samples.add()
	m.desc, m.value = d, v
	if h != nil {
		h.sum = v
		m.value = float64(len(s.samples.hists))
		s.samples.hists = append(s.samples.hists, h)
	}
	copy(m.labels[:], labels)
}

// reached records that the scrape hit a limit (backstop_scrape_limit_reached).
func (s *sink) reached(limit string) {
	if s.limits == nil {
		s.limits = map[string]bool{}
	}
	s.limits[limit] = true
}

// fail records an error reading key of q. Errors about one key (a wrong
// type, a refused command) are logged here with the key; errors about
// Redis as a whole are logged once per scrape by health.
func (s *sink) fail(q Queue, key string, err error) {
	kind := kindOf(err)
	if _, ok := s.kinds[kind]; !ok {
		s.kinds[kind] = err
	}
	if kind == kindWrongType || kind == kindReply {
		s.log.Warn("reading key failed", "queue", q.Name, "key", key, "kind", kind, "err", err)
	}
}

// The kinds of scrape error, the label of backstop_scrape_errors_total.
const (
	kindConnection = "connection" // Redis unreachable, or a node of the cluster
	kindAuth       = "auth"       // wrong password or user
	kindTimeout    = "timeout"    // the scrape's budget ran out
	kindWrongType  = "wrong_type" // a key holds another type than the layout says
	kindReply      = "reply"      // any other error reply, e.g. an ACL refusing a command
	kindStats      = "stats"      // a stats hash whose per-type counters exceed its totals (clamped)
)

var kinds = []string{kindConnection, kindAuth, kindTimeout, kindWrongType, kindReply, kindStats}

func kindOf(err error) string {
	var rerr redis.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled), isTimeout(err):
		return kindTimeout
	case errors.As(err, &rerr):
		msg := rerr.Error()
		switch {
		case strings.HasPrefix(msg, "WRONGTYPE"):
			return kindWrongType
		case strings.HasPrefix(msg, "NOAUTH"), strings.HasPrefix(msg, "WRONGPASS"):
			return kindAuth
		case strings.HasPrefix(msg, "LOADING"), strings.HasPrefix(msg, "CLUSTERDOWN"), strings.HasPrefix(msg, "MASTERDOWN"):
			return kindConnection
		}
		return kindReply
	}
	return kindConnection
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// isMissing reports an error that only says a key or group does not exist
// (yet): no error for a queue that never used it.
func isMissing(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	msg := rerr.Error()
	return strings.HasPrefix(msg, "ERR no such key") || strings.HasPrefix(msg, "NOGROUP")
}
