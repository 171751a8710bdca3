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

	"github.com/backstop-dev/backstop/console"
	"github.com/backstop-dev/backstop/internal/plot"
	"github.com/backstop-dev/backstop/internal/redact"
	"github.com/backstop-dev/backstop/queue"
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
	var b queue.Broker
	if rabbit {
		rb, err := f.rabbitBroker(ctx)
		if err != nil {
			return err
		}
		b = rb
	} else {
		rb, _, err := f.openRedis(args)
		if err != nil {
			return err
		}
		b = rb
	}
	defer b.Close()
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
	h, err := console.New(b.Kind(), qs, opts...)
	if err != nil {
		return err
	}
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
