// Command backstop-exporter serves Prometheus metrics about backstop's
// Redis queues: retries, delayed jobs, dead letters and the attempts jobs
// finish on (see package exporter for the metrics).
//
//	backstop-exporter --redis.addr=localhost:6379 --queues=orders,emails
//	backstop-exporter --redis.mode=cluster --redis.addr=10.0.0.1:6379,10.0.0.2:6379 --queues.pattern='{*}:jobs'
//
// Every flag can also be set by an environment variable named after it:
// BACKSTOP_REDIS_ADDR for --redis.addr, BACKSTOP_RABBITMQ_URL for
// --rabbitmq.url, and so on: BACKSTOP_ and the flag's name in capitals, its
// dots and dashes as underscores, the names the CLI, the workers and the
// RabbitMQ credentials (BACKSTOP_RABBITMQ_USER, BACKSTOP_RABBITMQ_PASSWORD)
// use too. The names before issue 42, BACKSTOP_EXPORTER_<FLAG>, are still
// read, with a deprecation line in the log. The flags are dotted
// (--redis.url), as the Prometheus exporters' and exporter-toolkit's
// (--web.listen-address) and promslog's (--log.level) are: one style in
// one binary, the one operators of exporters expect. TLS and basic auth for
// the web server come from --web.config.file (exporter-toolkit).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/common/promslog"
	promslogflag "github.com/prometheus/common/promslog/flag"
	"github.com/prometheus/common/version"
	"github.com/prometheus/exporter-toolkit/web"
	"github.com/prometheus/exporter-toolkit/web/kingpinflag"
	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/exporter"
	"github.com/backstop-dev/backstop/exporter/alerter"
	"github.com/backstop-dev/backstop/internal/buildinfo"
	"github.com/backstop-dev/backstop/internal/redact"
)

const name = "backstop-exporter"

// A build without -ldflags (go install, go build) takes its version from
// the build info rather than showing none (--version, the landing page,
// backstop_exporter_build_info).
func init() {
	if version.Version == "" {
		version.Version = buildinfo.Version()
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}

// flags are the command line, parsed.
type flags struct {
	redis       redisFlags
	rabbit      rabbitFlags
	queues      string
	pattern     string
	refresh     time.Duration
	maxKeys     int
	config      string
	timeout     time.Duration
	metricsPath string
	web         *web.FlagConfig
	log         promslog.Config
	alerter     alerterFlags
	// deprecated are the old environment variables set, each with its new
	// name: run logs them.
	deprecated [][2]string
}

// alerterFlags configure the alerter mode (alerter.Alerter): off without
// a URL.
type alerterFlags struct {
	url, configFile, consoleURL string
	interval, resolveAfter      time.Duration
}

type redisFlags struct {
	mode, addr, url, user, passwordFile, sentinelMaster string
}

// parse reads the flags from args and, for those not given, from the
// BACKSTOP_* environment (envNames).
func parse(args []string, stderr io.Writer) (*flags, error) {
	f := &flags{}
	app := kingpin.New(name, "Prometheus exporter of backstop's Redis or RabbitMQ queues: retries, delayed jobs, dead letters, attempts.")
	app.UsageWriter(stderr).ErrorWriter(stderr)
	app.HelpFlag.Short('h').NoEnvar()

	app.Flag("redis.mode", "How to reach Redis: standalone, sentinel or cluster.").Default("standalone").EnumVar(&f.redis.mode, "standalone", "sentinel", "cluster")
	app.Flag("redis.addr", "Redis address host:port; in cluster mode the seed nodes, in sentinel mode the sentinels, comma-separated.").Default("localhost:6379").StringVar(&f.redis.addr)
	app.Flag("redis.url", "Redis URL instead of --redis.addr: redis:// or rediss:// (TLS), with user, password and database; in cluster mode further seeds as ?addr=host:port.").StringVar(&f.redis.url)
	app.Flag("redis.user", "Redis ACL user name.").StringVar(&f.redis.user)
	app.Flag("redis.password-file", "File holding the Redis password (a trailing newline is ignored).").StringVar(&f.redis.passwordFile)
	app.Flag("redis.sentinel-master", "Name of the master the sentinels watch, in sentinel mode.").StringVar(&f.redis.sentinelMaster)
	f.rabbit.addFlags(app)
	app.Flag("queues", "Queues in the default layout ({name}:jobs, {name}:delayed, {name}:dlq, {name}:stats; group workers), comma-separated; with --rabbitmq.url, the work queues' names.").StringVar(&f.queues)
	app.Flag("queues.pattern", "Discover queues by SCAN MATCH on every master; the queue name is the key's hash tag, e.g. '{*}:jobs'.").StringVar(&f.pattern)
	app.Flag("queues.refresh-interval", "How long discovered queues are cached before the next SCAN.").Default("1m").DurationVar(&f.refresh)
	app.Flag("queues.max-keys", "Most matching keys one discovery takes; past it the keys are counted, not read, and backstop_scrape_limit_reached{limit=\"max_keys\"} says so.").Default("10000").IntVar(&f.maxKeys)
	app.Flag("queues.config", "YAML file of queues with their own key names and consumer groups (see package exporter, LoadQueuesConfig).").StringVar(&f.config)
	app.Flag("scrape.timeout", "Time budget of one scrape of Redis; a scrape that runs out says so in backstop_scrape_partial.").Default("5s").DurationVar(&f.timeout)
	app.Flag("web.telemetry-path", "Path under which to expose metrics.").Default("/metrics").StringVar(&f.metricsPath)
	app.Flag("alertmanager.url", "Alertmanager to post BackstopDLQIngestion to directly, seconds after a dead letter arrives (the alerter mode), e.g. http://localhost:9093; empty: off.").StringVar(&f.alerter.url)
	app.Flag("alertmanager.config.file", "File of how to reach Alertmanager, in the YAML form of Prometheus's http_config: basic_auth, authorization (bearer token), oauth2, tls_config, proxy_url, http_headers. A user and password in --alertmanager.url are sent as basic auth too (not both).").StringVar(&f.alerter.configFile)
	app.Flag("alertmanager.console-url", "The DLQ console (backstop console) the alerter's alerts link to in a console_url annotation, CONSOLE/queues/Q/dlq, as the rules do with rules/config.yaml's console_url; empty: none.").StringVar(&f.alerter.consoleURL)
	app.Flag("alertmanager.interval", "How often the alerter reads the DLQs and re-posts firing alerts.").Default("1s").DurationVar(&f.alerter.interval)
	app.Flag("alertmanager.resolve-after", "How long a queue's DLQ must stay without new entries before the alerter resolves its alert.").Default("1m").DurationVar(&f.alerter.resolveAfter)
	f.web = kingpinflag.AddFlags(app, ":9797")
	promslogflag.AddFlags(app, &f.log)
	app.Version(version.Print(name))
	app.VersionFlag.NoEnvar()
	f.deprecated = envNames(app)

	if _, err := app.Parse(args); err != nil {
		return nil, err
	}
	if f.alerter.configFile != "" && f.alerter.url == "" {
		return nil, errors.New("--alertmanager.config.file configures the alerter: give --alertmanager.url too")
	}
	if f.rabbit.url != "" {
		if err := f.rabbit.check(f); err != nil {
			return nil, err
		}
		return f, nil
	}
	if f.queues == "" && f.pattern == "" && f.config == "" {
		return nil, errors.New("no queues: give --queues, --queues.pattern or --queues.config")
	}
	return f, nil
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	f, err := parse(args, stderr)
	if err != nil {
		return err
	}
	f.log.Writer = stderr
	logger := promslog.New(&f.log)
	redis.SetLogger(redisLogger{logger})
	for _, d := range f.deprecated {
		logger.Warn("deprecated environment variable: rename it", "name", d[0], "new_name", d[1])
	}
	logger.Info("starting "+name, "version", version.Info())
	logger.Info("build context", "build_context", version.BuildContext())

	c, closeClient, err := f.newCollector(logger)
	if err != nil {
		return err
	}
	defer closeClient()
	defer c.Close() // its own connections to Redis, before the client's
	var extra []prometheus.Collector
	if f.alerter.url != "" {
		a, err := f.alerter.new(c, logger)
		if err != nil {
			return err
		}
		extra = append(extra, a)
		logger.Info("alerter started", "alertmanager", redact.URL(f.alerter.url), "config_file", f.alerter.configFile,
			"interval", f.alerter.interval, "resolve_after", f.alerter.resolveAfter)
		go a.Run(ctx)
	}
	handler, err := f.handler(c, logger, extra...)
	if err != nil {
		return err
	}
	server := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = server.Shutdown(shutdown)
	}()
	if err := web.ListenAndServe(server, f.web, logger); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	logger.Info("stopped")
	return nil
}

// new returns the alerter of the flags over c's queues.
func (a alerterFlags) new(c *exporter.Collector, logger *slog.Logger) (*alerter.Alerter, error) {
	opts := []alerter.Option{alerter.WithInterval(a.interval), alerter.WithResolveAfter(a.resolveAfter), alerter.WithLogger(logger),
		alerter.WithConsoleURL(strings.TrimRight(a.consoleURL, "/"))}
	if a.configFile != "" {
		cfg, err := alerter.LoadHTTPClientConfig(a.configFile)
		if err != nil {
			return nil, fmt.Errorf("--alertmanager.config.file: %w", err)
		}
		opts = append(opts, alerter.WithHTTPClientConfig(cfg))
	}
	return alerter.New(c, a.url, opts...)
}

// target describes the Redis the exporter reads, for the landing page:
// the mode and addresses, a URL without its password.
func (r redisFlags) target() string {
	mode := r.mode
	if mode == "" {
		mode = "standalone"
	}
	if r.url != "" {
		return mode + " " + redact.URL(r.url)
	}
	return mode + " " + strings.Join(splitList(r.addr), ", ")
}

// client returns the Redis client of the mode. Context deadlines are on
// so a slow Redis cannot hold a scrape past its budget.
func (r redisFlags) client() (redis.UniversalClient, error) {
	password, err := r.password()
	if err != nil {
		return nil, err
	}
	addrs := splitList(r.addr)
	switch r.mode {
	case "cluster":
		opt := &redis.ClusterOptions{Addrs: addrs}
		if r.url != "" {
			if opt, err = redis.ParseClusterURL(r.url); err != nil {
				return nil, fmt.Errorf("--redis.url: %w", redact.Error(err, r.url))
			}
		}
		setAuth(&opt.Username, &opt.Password, r.user, password)
		opt.ContextTimeoutEnabled = true
		return redis.NewClusterClient(opt), nil
	case "sentinel":
		if r.sentinelMaster == "" {
			return nil, errors.New("--redis.mode=sentinel needs --redis.sentinel-master")
		}
		opt := &redis.FailoverOptions{SentinelAddrs: addrs}
		if r.url != "" {
			if opt, err = redis.ParseFailoverURL(r.url); err != nil {
				return nil, fmt.Errorf("--redis.url: %w", redact.Error(err, r.url))
			}
		}
		opt.MasterName = r.sentinelMaster
		setAuth(&opt.Username, &opt.Password, r.user, password)
		opt.ContextTimeoutEnabled = true
		return redis.NewFailoverClient(opt), nil
	default:
		if len(addrs) != 1 && r.url == "" {
			return nil, fmt.Errorf("--redis.addr: standalone mode takes one address, got %q", r.addr)
		}
		opt := &redis.Options{Addr: r.addr}
		if r.url != "" {
			if opt, err = redis.ParseURL(r.url); err != nil {
				return nil, fmt.Errorf("--redis.url: %w", redact.Error(err, r.url))
			}
		}
		setAuth(&opt.Username, &opt.Password, r.user, password)
		opt.ContextTimeoutEnabled = true
		return redis.NewClient(opt), nil
	}
}

func (r redisFlags) password() (string, error) {
	if r.passwordFile == "" {
		return "", nil
	}
	b, err := os.ReadFile(r.passwordFile)
	if err != nil {
		return "", fmt.Errorf("--redis.password-file: %w", err)
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

// setAuth lets the flags override what a URL says.
func setAuth(user, password *string, u, p string) {
	if u != "" {
		*user = u
	}
	if p != "" {
		*password = p
	}
}

func splitList(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

func (f *flags) collector(rdb redis.UniversalClient, logger *slog.Logger) (*exporter.Collector, error) {
	opts := []exporter.Option{exporter.WithTimeout(f.timeout), exporter.WithLogger(logger)}
	for _, q := range splitList(f.queues) {
		opts = append(opts, exporter.WithQueues(exporter.QueueFor(q)))
	}
	if f.config != "" {
		qs, err := exporter.LoadQueuesConfig(f.config)
		if err != nil {
			return nil, err
		}
		opts = append(opts, exporter.WithQueues(qs...))
	}
	if f.pattern != "" {
		opts = append(opts, exporter.WithPattern(f.pattern, f.refresh, f.maxKeys))
	}
	return exporter.NewCollector(rdb, opts...)
}

// handler serves the metrics, a landing page and the health endpoints.
// /-/healthy answers while the process serves; /-/ready only while its
// source (Redis or RabbitMQ's management API) answers (issue 42: it said OK
// with Redis unreachable), 503 with the reason otherwise. Concurrent scrapes of the metrics share one
// collection and one encoded body per format (exporter.Collector.Handler).
func (f *flags) handler(c *exporter.Collector, logger *slog.Logger, extra ...prometheus.Collector) (http.Handler, error) {
	reg := prometheus.NewRegistry()
	for _, e := range extra { // the alerter's error counter
		if err := reg.Register(e); err != nil {
			return nil, fmt.Errorf("register collector: %w", err)
		}
	}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle(f.metricsPath, c.Handler(reg))
	ok := func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "OK\n") }
	mux.HandleFunc("/-/healthy", ok)
	mux.HandleFunc("/-/ready", func(w http.ResponseWriter, r *http.Request) {
		if err := c.Ready(r.Context()); err != nil {
			http.Error(w, "not ready: its source does not answer: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		ok(w, r)
	})
	if f.metricsPath != "/" {
		links := []web.LandingLinks{
			{Address: f.metricsPath, Text: "Metrics"},
			{Address: "/-/healthy", Text: "Health"},
			{Address: "/-/ready", Text: "Readiness"},
		}
		// The page's template is checked once here; each view renders it again.
		if _, err := web.NewLandingPage(web.LandingConfig{Name: name, Version: version.Info(), Links: links}); err != nil {
			return nil, fmt.Errorf("landing page: %w", err)
		}
		l := newLanding(c, f.target(), f.metricsPath, links)
		mux.Handle("/", l)
		mux.HandleFunc("/queue", l.queuePage)
	}
	return mux, nil
}

// redisLogger sends go-redis's own log lines (dial retries and the like)
// to slog at debug level: the scrape reports the same failures itself.
type redisLogger struct{ l *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	r.l.DebugContext(ctx, "redis client", "detail", fmt.Sprintf(format, v...))
}

// envNames names each flag's environment variable BACKSTOP_<FLAG>
// (--redis.url: BACKSTOP_REDIS_URL), unless the flag names its own, and
// reads the old name, BACKSTOP_EXPORTER_<FLAG>, as the flag's default when
// the new one is not set. It returns the old names set, with the new ones.
func envNames(app *kingpin.Application) (deprecated [][2]string) {
	for _, fl := range app.Model().Flags {
		if fl.Name == "help" || fl.Name == "version" || fl.Envar != "" {
			continue
		}
		env := "BACKSTOP_" + strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(fl.Name))
		clause := app.GetFlag(fl.Name).Envar(env)
		old := "BACKSTOP_EXPORTER_" + strings.TrimPrefix(env, "BACKSTOP_")
		if v, ok := os.LookupEnv(old); ok {
			deprecated = append(deprecated, [2]string{old, env})
			if _, set := os.LookupEnv(env); !set {
				clause.Default(v)
			}
		}
	}
	return deprecated
}
