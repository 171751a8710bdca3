// Package alerter posts the DLQ ingestion alert of the shipped rules to
// Alertmanager directly, seconds after a dead letter arrives: the alerter
// mode of backstop-exporter (--alertmanager.url). It reads the queues
// through an exporter.Collector and takes the alert from package rules, so
// it sits downstream of both.
package alerter

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promconfig "github.com/prometheus/common/config"

	"github.com/backstop-dev/backstop/exporter"
	"github.com/backstop-dev/backstop/internal/redact"
	"github.com/backstop-dev/backstop/rules"
)

type config struct {
	interval     time.Duration
	resolveAfter time.Duration
	runbookURL   string
	grafanaURL   string
	consoleURL   string
	http         promconfig.HTTPClientConfig
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
// anchor is appended) and the Grafana of the dashboard_url annotation (the
// queue dashboard with the alert's queue selected). The defaults are those
// of the shipped rules (rules.Default: runbook_url, grafana_url).
func WithURLs(runbook, grafana string) Option {
	return func(c *config) { c.runbookURL, c.grafanaURL = runbook, grafana }
}

// WithConsoleURL sets the DLQ console (`backstop console`, no trailing
// slash) of the console_url annotation: CONSOLE/queues/Q/dlq, the queue's
// dead letters, as the rules write it for rules/config.yaml's console_url.
// The default is none (no console_url annotation).
func WithConsoleURL(console string) Option {
	return func(c *config) { c.consoleURL = console }
}

// WithHTTPClientConfig sets how the alerter reaches Alertmanager: basic
// auth, an Authorization header (bearer token), OAuth 2, TLS (a CA, a
// client certificate), a proxy and extra headers, in the form of
// Prometheus's http_config (see LoadHTTPClientConfig). The default is
// promconfig.DefaultHTTPClientConfig: no credentials, the system's CAs.
// A user and password in the Alertmanager URL are sent as basic auth when
// cfg has no credentials of its own.
func WithHTTPClientConfig(cfg promconfig.HTTPClientConfig) Option {
	return func(c *config) { c.http = cfg }
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
// Requests carry the credentials and TLS settings of WithHTTPClientConfig
// or of the URL's userinfo; no log line or error shows them.
//
// Errors from Redis or Alertmanager are logged, counted in
// backstop_alerter_errors_total{kind} (the Alerter is a
// prometheus.Collector) and retried on the next interval.
type Alerter struct {
	coll   *exporter.Collector
	amURL  string       // <base>/api/v2/alerts, without credentials
	client *http.Client // with the credentials and TLS of the HTTP client config
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
// at amURL, e.g. http://alertmanager:9093 (a path prefix is kept;
// http://user:password@alertmanager:9093 sends basic auth). No error or
// log line shows the URL's password (package redact).
//
// # Errors
//
// A nil collector, a URL that is not http(s) with a host, an interval or
// resolve window that is not positive, an HTTP client config that is not
// valid, or credentials both in the URL and in the HTTP client config.
func New(c *exporter.Collector, amURL string, opts ...Option) (*Alerter, error) {
	if c == nil {
		return nil, errNoQueues
	}
	d := rules.Default()
	cfg := config{
		interval: time.Second, resolveAfter: time.Minute,
		runbookURL: d.RunbookURL, grafanaURL: d.GrafanaURL,
		http: promconfig.DefaultHTTPClientConfig,
		log:  slog.New(slog.DiscardHandler), now: time.Now,
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
		return nil, fmt.Errorf("alerter: alertmanager URL: %w", redact.Error(err, amURL))
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("alerter: alertmanager URL %q: want http(s)://host:port", redact.URL(amURL))
	}
	client, err := newClient(cfg.http, u.User)
	if err != nil {
		return nil, err
	}
	// Scheme, host and path prefix only: the credentials go through the
	// client, never in the URL a log line or an error could show.
	post := url.URL{Scheme: u.Scheme, Host: u.Host, Path: strings.TrimSuffix(u.Path, "/") + "/api/v2/alerts"}
	d.RunbookURL, d.GrafanaURL, d.ConsoleURL = cfg.runbookURL, cfg.grafanaURL, cfg.consoleURL
	rule, ok := rules.Alerts(d).Alert(rules.AlertDLQIngestion)
	if !ok { // the rules and the alerter are built together: a bug
		return nil, fmt.Errorf("alerter: the rules have no alert %s", rules.AlertDLQIngestion)
	}
	return &Alerter{
		coll:   c,
		amURL:  post.String(),
		client: client,
		cfg:    cfg,
		rule:   rule,
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "backstop_alerter_errors_total",
			Help: "Errors of the alerter (--alertmanager.url) by kind: redis (reading the DLQs or discovering queues) or alertmanager (posting alerts).",
		}, []string{"kind"}),
		state:   map[string]*watch{},
		unknown: map[string]bool{},
	}, nil
}

// LoadHTTPClientConfig reads how to reach Alertmanager from the YAML file
// at path, in the form of Prometheus's http_config (the same keys as an
// alertmanager_config of prometheus.yml), for WithHTTPClientConfig:
//
//	basic_auth:
//	  username: backstop
//	  password_file: /run/secrets/alertmanager  # or password: …
//	tls_config:
//	  ca_file: /etc/ssl/alertmanager-ca.pem
//
// Relative file names are taken from the file's directory.
//
// # Errors
//
// A file that cannot be read, unknown keys, or a config that is not valid
// (two kinds of credentials at once). The YAML parser's error names the
// line and the field but not the value found there, which may be a secret.
func LoadHTTPClientConfig(path string) (promconfig.HTTPClientConfig, error) {
	cfg, _, err := promconfig.LoadHTTPConfigFile(path)
	var pathErr *fs.PathError
	switch {
	case errors.As(err, &pathErr): // reading the file
		return promconfig.HTTPClientConfig{}, err
	case err != nil:
		return promconfig.HTTPClientConfig{}, fmt.Errorf("%s: %s", path, yamlValue.ReplaceAllString(err.Error(), "`<value>`"))
	}
	if err := cfg.Validate(); err != nil {
		return promconfig.HTTPClientConfig{}, fmt.Errorf("%s: %w", path, err)
	}
	return *cfg, nil
}

// yamlValue is a value quoted in an error of the YAML parser
// ("cannot unmarshal !!str `hunter2` into …").
var yamlValue = regexp.MustCompile("`[^`]*`")

// newClient returns the HTTP client of cfg, with the URL's user and
// password (userinfo, if any) as basic auth.
func newClient(cfg promconfig.HTTPClientConfig, userinfo *url.Userinfo) (*http.Client, error) {
	if userinfo != nil {
		if cfg.BasicAuth != nil || cfg.Authorization != nil || cfg.OAuth2 != nil || cfg.BearerToken != "" || cfg.BearerTokenFile != "" {
			return nil, errors.New("alerter: credentials both in the alertmanager URL and in the HTTP client config: give them once")
		}
		password, _ := userinfo.Password()
		cfg.BasicAuth = &promconfig.BasicAuth{Username: userinfo.Username(), Password: promconfig.Secret(password)}
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("alerter: HTTP client config: %w", err)
	}
	client, err := promconfig.NewClientFromConfig(cfg, "backstop-alerter")
	if err != nil {
		return nil, fmt.Errorf("alerter: HTTP client config: %w", err)
	}
	return client, nil
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
	var post []postableAlert
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
			a.cfg.log.Info("dlq alert resolved", "queue", post[i].Labels["queue"])
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
func (a *Alerter) alert(name string, w *watch, ends time.Time) postableAlert {
	labels := map[string]string{"alertname": a.rule.Alert, "queue": name}
	for k, v := range a.rule.Labels {
		labels[k] = v
	}
	// The rule's templates, expanded as Prometheus would.
	expand := func(s string) string {
		return strings.ReplaceAll(s, "{{ $labels.queue | urlquery }}", url.QueryEscape(name))
	}
	annotations := map[string]string{
		"summary": "Jobs are being dead-lettered on queue " + name + ".",
		"description": fmt.Sprintf("Queue %s has dead-lettered %d jobs since %s: work is failing for good. Find the reasons with `backstop dlq inspect --queue %s`.",
			name, w.added-w.from, w.startsAt.UTC().Format(time.RFC3339), name),
		"runbook_url":   a.rule.Annotations["runbook_url"],
		"dashboard_url": expand(a.rule.Annotations["dashboard_url"]),
	}
	if u, ok := a.rule.Annotations["console_url"]; ok {
		annotations["console_url"] = expand(u)
	}
	return postableAlert{
		Labels:      labels,
		Annotations: annotations,
		StartsAt:    w.startsAt.Format(amTime),
		EndsAt:      ends.Format(amTime),
	}
}

// postableAlert is an element of the body of Alertmanager's POST
// /api/v2/alerts (PostableAlert in its OpenAPI spec), written here rather
// than taken from its generated client (api/v2/client), which brings
// go-openapi's runtime, its server middleware and OpenTelemetry into the
// exporter binary for one request: with Alertmanager v0.35.0, 31.9 -> 36.7
// MB and 332 -> 428 packages. The request goes through the same
// HTTPClientConfig client either way; the tests decode and validate what
// is posted with Alertmanager's own models, and post to a real
// Alertmanager with basic auth on (internal/integration/e2e).
type postableAlert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations,omitempty"`
	StartsAt    string            `json:"startsAt,omitempty"`
	EndsAt      string            `json:"endsAt,omitempty"`
}

// amTime is the date-time format of the spec as the generated client
// wrote it (RFC 3339 with milliseconds).
const amTime = "2006-01-02T15:04:05.000Z07:00"

// post sends alerts to Alertmanager in one request. It waits at most an
// interval, but no less than 5s (Alertmanager may be slower than a short
// interval) and no more than 30s (the generated client's request timeout,
// kept so a long interval does not leave a hung request up for longer).
func (a *Alerter) post(ctx context.Context, alerts []postableAlert) error {
	body, err := json.Marshal(alerts)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, min(max(a.cfg.interval, 5*time.Second), 30*time.Second))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.amURL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	res, err := a.client.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	// Alertmanager says why it refused in the body: keep its start.
	start, _ := io.ReadAll(io.LimitReader(res.Body, 256))
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10)) // so the connection is reused
	if res.StatusCode < 200 || res.StatusCode > 299 {
		return fmt.Errorf("alertmanager: POST %s: %s: %q", a.amURL, res.Status, bytes.TrimSpace(start))
	}
	return nil
}
