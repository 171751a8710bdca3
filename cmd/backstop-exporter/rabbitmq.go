package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"

	"github.com/alecthomas/kingpin/v2"

	"github.com/backstop-dev/backstop/exporter"
)

// rabbitFlags are the flags of the RabbitMQ mode (--rabbitmq.url).
type rabbitFlags struct {
	url, user, passwordFile, vhost, pattern string
}

// The variables of the RabbitMQ credentials, shared with the workers and
// the CLI rather than named after the exporter's flags.
const (
	envRabbitUser     = "BACKSTOP_RABBITMQ_USER"
	envRabbitPassword = "BACKSTOP_RABBITMQ_PASSWORD"
)

func (r *rabbitFlags) addFlags(app *kingpin.Application) {
	app.Flag("rabbitmq.url", "Read backstop's queues on RabbitMQ through its management API instead of Redis, e.g. http://localhost:15672 (a user and password in the URL are allowed). "+
		"Reports depths (backstop_stream_lag_jobs and backstop_stream_pending_jobs with group=\"\"), backstop_dlq_size, backstop_dlq_ingested_total, backstop_delayed_queue_size and the delay levels; "+
		"attempts by outcome, retries and dead letters by reason and the attempt distribution come from the RabbitMQ workers' own metrics (same names), which the broker cannot know. "+
		"The queues are --queues (work queue names) and --rabbitmq.queue-pattern.").StringVar(&r.url)
	app.Flag("rabbitmq.user", "Management API user (overrides the URL's).").Envar(envRabbitUser).StringVar(&r.user)
	app.Flag("rabbitmq.password-file", "File holding the management API password (a trailing newline is ignored); without it $"+envRabbitPassword+", then the URL's.").StringVar(&r.passwordFile)
	app.Flag("rabbitmq.vhost", "Virtual host of the queues.").Default("/").StringVar(&r.vhost)
	app.Flag("rabbitmq.queue-pattern", "Also report every work queue of the virtual host whose whole name matches this regular expression (RE2), e.g. 'orders|emails' or '.*'; a work queue is one declared with backstop's topology (it dead-letters to <name>.dlq).").StringVar(&r.pattern)
}

// check refuses the Redis-only flags in the RabbitMQ mode, and no queues.
func (r rabbitFlags) check(f *flags) error {
	switch {
	case f.pattern != "":
		return errors.New("--queues.pattern reads Redis keys: with --rabbitmq.url use --rabbitmq.queue-pattern")
	case f.config != "":
		return errors.New("--queues.config describes Redis key layouts: with --rabbitmq.url give --queues or --rabbitmq.queue-pattern")
	case f.queues == "" && r.pattern == "":
		return errors.New("no queues: with --rabbitmq.url give --queues or --rabbitmq.queue-pattern")
	}
	return nil
}

// credentials returns the user and password: the flag, file and
// environment override the URL's userinfo; ok is false when none is given
// (the URL's, if any, is used).
func (r rabbitFlags) credentials() (user, password string, ok bool, err error) {
	if u, err := url.Parse(r.url); err == nil && u.User != nil {
		user = u.User.Username()
		password, _ = u.User.Password()
		ok = true
	}
	if r.user != "" {
		user, ok = r.user, true
	}
	switch {
	case r.passwordFile != "":
		b, err := os.ReadFile(r.passwordFile)
		if err != nil {
			return "", "", false, fmt.Errorf("--rabbitmq.password-file: %w", err)
		}
		password, ok = strings.TrimRight(string(b), "\r\n"), true
	case os.Getenv(envRabbitPassword) != "":
		password, ok = os.Getenv(envRabbitPassword), true
	}
	return user, password, ok, nil
}

// target describes the broker for the landing page, without a password.
func (r rabbitFlags) target() string {
	if u, err := url.Parse(r.url); err == nil {
		u.User = nil
		return "RabbitMQ " + u.String() + " vhost " + r.vhost
	}
	return "RabbitMQ (--rabbitmq.url)"
}

// target describes what the exporter reads, for the landing page.
func (f *flags) target() string {
	if f.rabbit.url != "" {
		return f.rabbit.target()
	}
	return f.redis.target()
}

// newCollector returns the collector of the mode, and what closes its
// client.
func (f *flags) newCollector(logger *slog.Logger) (*exporter.Collector, func(), error) {
	if f.rabbit.url == "" {
		rdb, err := f.redis.client()
		if err != nil {
			return nil, nil, err
		}
		c, err := f.collector(rdb, logger)
		if err != nil {
			rdb.Close()
			return nil, nil, err
		}
		return c, func() { rdb.Close() }, nil
	}
	c, err := f.rabbitCollector(logger)
	return c, func() {}, err
}

func (f *flags) rabbitCollector(logger *slog.Logger) (*exporter.Collector, error) {
	opts := []exporter.Option{exporter.WithTimeout(f.timeout), exporter.WithLogger(logger), exporter.WithRabbitMQVHost(f.rabbit.vhost)}
	user, password, ok, err := f.rabbit.credentials()
	if err != nil {
		return nil, err
	}
	if ok {
		opts = append(opts, exporter.WithRabbitMQCredentials(user, password))
	}
	for _, q := range splitList(f.queues) {
		opts = append(opts, exporter.WithQueues(exporter.Queue{Name: q}))
	}
	if f.rabbit.pattern != "" {
		opts = append(opts, exporter.WithRabbitMQPattern(f.rabbit.pattern))
	}
	return exporter.NewRabbitMQCollector(f.rabbit.url, opts...)
}
