// Package alerter posts the DLQ ingestion alert of the shipped rules to
// Alertmanager directly, seconds after a dead letter arrives: the alerter
// mode of backstop-exporter (--alertmanager.url). It reads the queues
// through an exporter.Collector and takes the alert from package rules, so
// it sits downstream of both.
package alerter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/go-openapi/strfmt"
	amclient "github.com/prometheus/alertmanager/api/v2/client"
	amalert "github.com/prometheus/alertmanager/api/v2/client/alert"
	"github.com/prometheus/alertmanager/api/v2/models"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/backstop-dev/backstop/exporter"
	"github.com/backstop-dev/backstop/rules"
)

type config struct {
	interval     time.Duration
	resolveAfter time.Duration
	runbookURL   string
	dashboardURL string
	log          *slog.Logger
	now          func() time.Time // the clock: a seam for tests
}

// Option configures an Alerter.
type Option func(*config)

// WithInterval sets how often the alerter reads the dead letter
// streams and re-posts firing alerts (default 1s).
func WithInterval(d time.Duration) Option {
	return func(c *config) { c.interval = d }
}

// WithResolveAfter sets how long a queue's DLQ must stay without a new
// entry before its alert is resolved (default 1m).
func WithResolveAfter(d time.Duration) Option {
	return func(c *config) { c.resolveAfter = d }
}

// WithURLs sets the base of the runbook_url annotation (the alert's
// anchor is appended) and the dashboard_url annotation. The defaults are
// those of the shipped rules (rules.Default).
func WithURLs(runbook, dashboard string) Option {
	return func(c *config) { c.runbookURL, c.dashboardURL = runbook, dashboard }
}

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.log = l }
}

// Alerter watches the DLQ ingestion of a Collector's queues and posts the
// BackstopDLQIngestion alert to Alertmanager's v2 API itself, seconds
// after a dead letter arrives, without waiting for scrape, rule evaluation
// and its `for`. The alert carries exactly the rule-based alert's labels
// (alertname, severity=critical, queue), so Alertmanager deduplicates the
// two.
//
// Every interval it reads each queue's DLQ ingestion, in one pipeline, as
// the collector reads backstop_dlq_ingested_total: XINFO STREAM
// entries-added, or on a server that does not report it (Redis 6, the
// embedded server of backstop demo) the dead letters the queue scripts
// wrote. A queue whose ingestion is unknown (entries-added not reported and
// DLQ entries the scripts did not write) is not watched, and says so once
// in the log. The first read of a queue is its baseline: dead letters that
// were there before do not page. When the count grows, the queue's alert
// fires (startsAt the first growth) and is re-posted every interval with
// endsAt a lease ahead (3 intervals plus the resolve window), so it stays
// firing while the alerter runs and expires on its own when it dies. When
// the count has not grown for the resolve window, the alert is posted once
// more with endsAt now, which resolves it.
//
// Errors from Redis or Alertmanager are logged, counted in
// backstop_alerter_errors_total{kind} (the Alerter is a
// prometheus.Collector) and retried on the next interval.
type Alerter struct {
	coll   *exporter.Collector
	api    *amclient.AlertmanagerAPI
	cfg    config
	rule   rules.Rule // the rule-based alert the alerter doubles
	errors *prometheus.CounterVec

	mu      sync.Mutex        // guards state against concurrent Run calls
	state   map[string]*watch // by queue name
	inited  bool
	unknown map[string]bool // queues whose ingestion was unknown at the last read, logged once
}

// watch is the alerter's memory of one queue.
type watch struct {
	added     int64     // ingestion (entries-added) at the last successful read
	from      int64     // ingestion before the first growth of the firing alert
	firing    bool      // an alert is posted and not resolved yet
	startsAt  time.Time // first growth of the firing alert
	lastGrown time.Time // last read that saw growth
}

var errNoQueues = errors.New("alerter: nil collector")

// New returns an alerter of c's queues (the configured and the
// discovered ones, over c's Redis client) that posts to the Alertmanager
// at amURL, e.g. http://alertmanager:9093 (a path prefix is kept).
//
// # Errors
//
// A nil collector, a URL that is not http(s) with a host, or an interval
// or resolve window that is not positive.
func New(c *exporter.Collector, amURL string, opts ...Option) (*Alerter, error) {
	if c == nil {
		return nil, errNoQueues
	}
	d := rules.Default()
	cfg := config{
		interval: time.Second, resolveAfter: time.Minute,
		runbookURL: d.RunbookURL, dashboardURL: d.DashboardURL,
		log: slog.New(slog.DiscardHandler), now: time.Now,
	}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.log == nil {
		cfg.log = slog.New(slog.DiscardHandler)
	}
	if cfg.interval <= 0 || cfg.resolveAfter <= 0 {
		return nil, fmt.Errorf("alerter: interval and resolve window must be positive, got %v and %v", cfg.interval, cfg.resolveAfter)
	}
	u, err := url.Parse(amURL)
	if err != nil {
		return nil, fmt.Errorf("alerter: alertmanager URL: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("alerter: alertmanager URL %q: want http(s)://host:port", amURL)
	}
	tc := amclient.DefaultTransportConfig().
		WithHost(u.Host).
		WithSchemes([]string{u.Scheme}).
		WithBasePath(strings.TrimSuffix(u.Path, "/") + amclient.DefaultBasePath)
	d.RunbookURL, d.DashboardURL = cfg.runbookURL, cfg.dashboardURL
	rule, ok := rules.Alerts(d).Alert(rules.AlertDLQIngestion)
	if !ok { // the rules and the alerter are built together: a bug
		return nil, fmt.Errorf("alerter: the rules have no alert %s", rules.AlertDLQIngestion)
	}
	return &Alerter{
		coll: c,
		api:  amclient.NewHTTPClientWithConfig(strfmt.Default, tc),
		cfg:  cfg,
		rule: rule,
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "backstop_alerter_errors_total",
			Help: "Errors of the alerter (--alertmanager.url) by kind: redis (reading the DLQs or discovering queues) or alertmanager (posting alerts).",
		}, []string{"kind"}),
		state:   map[string]*watch{},
		unknown: map[string]bool{},
	}, nil
}

// Describe implements prometheus.Collector.
func (a *Alerter) Describe(ch chan<- *prometheus.Desc) { a.errors.Describe(ch) }

// Collect implements prometheus.Collector.
func (a *Alerter) Collect(ch chan<- prometheus.Metric) { a.errors.Collect(ch) }

// Run reads and posts every interval until ctx ends, and returns nil then.
// Errors do not stop it.
func (a *Alerter) Run(ctx context.Context) error {
	a.errors.WithLabelValues("redis").Add(0)
	a.errors.WithLabelValues("alertmanager").Add(0)
	t := time.NewTicker(a.cfg.interval)
	defer t.Stop()
	for {
		a.tick(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// tick reads every queue's DLQ once and posts what changed.
func (a *Alerter) tick(ctx context.Context) {
	a.mu.Lock()
	defer a.mu.Unlock()
	counts := a.read(ctx)
	now := a.cfg.now()
	first := !a.inited
	if counts != nil {
		a.inited = true
	}
	var post models.PostableAlerts
	var posted []*watch // in post's order
	var resolving []bool
	for name, n := range counts {
		w, ok := a.state[name]
		if !ok || first {
			a.state[name] = &watch{added: n} // baseline
			continue
		}
		switch {
		case n > w.added:
			if !w.firing {
				w.firing, w.startsAt, w.from = true, now, w.added
			}
			w.lastGrown = now
		case n < w.added: // the stream was deleted and recreated: a new baseline
			if w.firing {
				w.from = max(0, w.from-(w.added-n))
			}
		}
		w.added = n
	}
	lease := 3*a.cfg.interval + a.cfg.resolveAfter
	for name, w := range a.state {
		if !w.firing {
			continue
		}
		// Resolve only on a fresh read: while Redis cannot be read, quiet
		// proves nothing, so the page stays up (and the RedisDown alert
		// inhibits it).
		_, seen := counts[name]
		resolve := seen && now.Sub(w.lastGrown) >= a.cfg.resolveAfter
		ends := now.Add(lease)
		if resolve {
			ends = now
		}
		post = append(post, a.alert(name, w, ends))
		posted = append(posted, w)
		resolving = append(resolving, resolve)
	}
	if len(post) == 0 {
		return
	}
	if err := a.post(ctx, post); err != nil {
		a.errors.WithLabelValues("alertmanager").Inc()
		a.cfg.log.Error("posting alerts to alertmanager failed", "alerts", len(post), "err", err)
		return // firing and resolving alerts are posted again on the next tick
	}
	for i, w := range posted {
		if resolving[i] {
			w.firing = false
			a.cfg.log.Info("dlq alert resolved", "queue", string(post[i].Labels["queue"]))
		}
	}
}

// read returns the ingestion of every queue's DLQ by queue name
// (exporter.DLQIngestion, the figure of backstop_dlq_ingested_total),
// leaving out the queues whose read failed or whose ingestion is unknown;
// nil when nothing could be read.
func (a *Alerter) read(ctx context.Context) map[string]int64 {
	ins, err := a.coll.DLQIngestion(ctx)
	if err != nil {
		a.errors.WithLabelValues("redis").Inc()
		a.cfg.log.Error("alerter queue discovery failed", "err", err)
	}
	counts := make(map[string]int64, len(ins))
	var failed error
	bad := 0
	for _, in := range ins {
		switch {
		case in.Err != nil:
			bad++
			if failed == nil {
				failed = in.Err
			}
		case in.Known:
			counts[in.Queue] = in.Ingested
			delete(a.unknown, in.Queue)
		case !a.unknown[in.Queue]:
			a.unknown[in.Queue] = true
			a.cfg.log.Warn("alerter cannot watch dlq: the server does not report entries-added and the queue scripts did not write all of its entries",
				"queue", in.Queue, "dlq_size", in.Size)
		}
	}
	if failed != nil {
		a.errors.WithLabelValues("redis").Inc()
		a.cfg.log.Error("alerter reading dlq failed", "queues", bad, "err", failed)
	}
	if len(counts) == 0 {
		return nil
	}
	return counts
}

// alert is queue name's BackstopDLQIngestion alert, ending at ends: the
// rule's name, labels and links, so Alertmanager sees one alert from both
// sources; summary and description say what the alerter saw.
func (a *Alerter) alert(name string, w *watch, ends time.Time) *models.PostableAlert {
	labels := models.LabelSet{"alertname": a.rule.Alert, "queue": name}
	for k, v := range a.rule.Labels {
		labels[k] = v
	}
	return &models.PostableAlert{
		Alert: models.Alert{Labels: labels},
		Annotations: models.LabelSet{
			"summary": "Jobs are being dead-lettered on queue " + name + ".",
			"description": fmt.Sprintf("Queue %s has dead-lettered %d jobs since %s: work is failing for good. Find the reasons with `backstop dlq inspect --queue %s`.",
				name, w.added-w.from, w.startsAt.UTC().Format(time.RFC3339), name),
			"runbook_url":   a.rule.Annotations["runbook_url"],
			"dashboard_url": a.rule.Annotations["dashboard_url"],
		},
		StartsAt: strfmt.DateTime(w.startsAt),
		EndsAt:   strfmt.DateTime(ends),
	}
}

func (a *Alerter) post(ctx context.Context, alerts models.PostableAlerts) error {
	ctx, cancel := context.WithTimeout(ctx, max(a.cfg.interval, 5*time.Second))
	defer cancel()
	_, err := a.api.Alert.PostAlerts(amalert.NewPostAlertsParamsWithContext(ctx).WithAlerts(alerts))
	return err
}
