package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/exporter-toolkit/web"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/backstop-dev/backstop/console"
	"github.com/backstop-dev/backstop/exporter"
	"github.com/backstop-dev/backstop/internal/plot"
	"github.com/backstop-dev/backstop/internal/redact"
	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// backstop console: the web console of package console over the queues
// --queue names, on Redis or RabbitMQ as the queue commands choose, served
// by exporter-toolkit (--web.listen-address, --web.config.file for TLS and
// basic auth), read-only unless --writable.
func consoleCmd(ctx context.Context, args []string, stderr io.Writer) error {
	f := newQueueFlags("console")
	// --queue is repeatable here (a comma-separated list too).
	var names queueList
	fl := f.fs.Lookup("queue")
	fl.Value, fl.Usage = &names, "a queue to show (repeatable, or comma-separated)"
	listen := f.fs.String("web.listen-address", ":9798", "address to listen on")
	webConfig := f.fs.String("web.config.file", "", "exporter-toolkit web configuration (TLS, basic auth users) — without it anyone who reaches the address reads the dead letters")
	prom := f.fs.String("prometheus.url", "", "Prometheus to read the last hour's retry rate and DLQ ingestion from, e.g. http://localhost:9090 (optional)")
	every := f.fs.Duration("sample.interval", 15*time.Second, "without --prometheus.url: how often the console samples the queues' retries and DLQ ingestion (the exporter's readers; on RabbitMQ through --rabbitmq.management-url) for the overview's last hour, 1s to 30m (two samples an hour at least)")
	writable := f.fs.Bool("writable", false, "allow replay, delete, purge and force run (default read-only)")
	policyArg := f.fs.String("policy", "", "the policy in force, FILE or PRESET, shown with its schedule on the overview (optional)")
	rabbit, err := f.useRabbit(args)
	if err != nil {
		return err
	}
	if _, err := parseFlags(f.fs, args); err != nil {
		return err
	}
	if len(names) == 0 {
		return fmt.Errorf("%w: --queue is required (repeatable, or comma-separated)", errUsage)
	}
	if *writable && *webConfig == "" && !loopback(*listen) {
		return fmt.Errorf("%w: --writable without --web.config.file lets anyone who reaches %s replay and delete dead letters: give a web configuration with basic auth users, or listen on a loopback address (--web.listen-address 127.0.0.1:9798)", errUsage, *listen)
	}
	*f.name = names[0]
	if *prom != "" {
		if u, err := url.Parse(*prom); err != nil || (u.Scheme != "http" && u.Scheme != "https") {
			return fmt.Errorf("--prometheus.url: want http(s)://host:port, got %q", redact.URL(*prom))
		}
	}
	var opts []console.Option
	if *policyArg != "" {
		p, name, src, err := loadPolicy(*policyArg)
		if err != nil {
			return err
		}
		var svg bytes.Buffer
		if err := plot.Schedule(&svg, "svg", plot.NewEnvelope(p, name, 12, 200, 1)); err != nil {
			return err
		}
		opts = append(opts, console.WithPolicy(name, string(src), svg.Bytes()))
	}
	if *prom == "" && (*every < time.Second || *every > 30*time.Minute) {
		return fmt.Errorf("%w: --sample.interval must be 1s to 30m, got %v", errUsage, *every)
	}
	var b queue.Broker
	var collector *exporter.Collector // the readers of the overview's last hour, without a Prometheus
	if rabbit {
		rb, err := f.rabbitBroker(ctx)
		if err != nil {
			return err
		}
		b = rb
		if *prom == "" && *f.rabbit.mgmt != "" {
			if collector, err = rabbitCollector(*f.rabbit.amqp, *f.rabbit.mgmt, names); err != nil {
				rb.Close()
				return err
			}
		}
	} else {
		rdb, err := f.redisClient(args)
		if err != nil {
			return err
		}
		b = redisqueue.NewBroker(rdb, redisqueue.WithQueueOptions(redisqueue.WithGroup(*f.group)))
		if *prom == "" {
			var qs []exporter.Queue
			for _, n := range names {
				qs = append(qs, exporter.QueueFor(n))
			}
			if collector, err = exporter.NewCollector(rdb, exporter.WithQueues(qs...)); err != nil {
				b.Close()
				return err
			}
		}
	}
	defer b.Close()
	if collector != nil {
		defer collector.Close()
	}
	var qs []queue.Queue
	for _, n := range names {
		q, err := b.Open(n)
		if err != nil {
			return err
		}
		qs = append(qs, q)
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	opts = append(opts, console.WithWritable(*writable), console.WithPrometheus(*prom), console.WithLogger(logger))
	if collector != nil {
		opts = append(opts, console.WithExporter(collector, *every))
	}
	h, err := console.New(b.Kind(), qs, opts...)
	if err != nil {
		return err
	}
	defer h.Close()
	server := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = server.Shutdown(shutdown)
	}()
	mode := "read-only"
	if *writable {
		mode = "writable"
	}
	logger.Info("console started", "broker", b.Kind(), "queues", names, "mode", mode, "web_config", *webConfig != "")
	addrs, systemd := []string{*listen}, false
	err = web.ListenAndServe(server, &web.FlagConfig{WebListenAddresses: &addrs, WebSystemdSocket: &systemd, WebConfigFile: webConfig}, logger)
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// rabbitCollector is the exporter's RabbitMQ collector of the queues
// names, over the management API at mgmt, in the virtual host of the
// AMQP URL.
func rabbitCollector(amqpURL, mgmt string, names []string) (*exporter.Collector, error) {
	u, err := amqp.ParseURI(amqpURL)
	if err != nil {
		return nil, fmt.Errorf("--amqp.url: %w", redact.Error(err, amqpURL))
	}
	var qs []exporter.Queue
	for _, n := range names {
		qs = append(qs, exporter.Queue{Name: n})
	}
	c, err := exporter.NewRabbitMQCollector(mgmt, exporter.WithQueues(qs...), exporter.WithRabbitMQVHost(u.Vhost))
	if err != nil {
		return nil, fmt.Errorf("--rabbitmq.management-url: %w", err)
	}
	return c, nil
}

// loopback reports whether a listen address takes connections from this
// machine only (127.0.0.0/8, ::1, localhost); ":9798" takes them from
// every interface.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// queueList is a repeatable --queue.
type queueList []string

func (l *queueList) String() string { return strings.Join(*l, ",") }

func (l *queueList) Set(s string) error {
	// The flags are parsed more than once (the broker's choice, then the
	// command's): a name already there is not added again.
	for _, n := range splitList(s) {
		if !slices.Contains(*l, n) {
			*l = append(*l, n)
		}
	}
	return nil
}
