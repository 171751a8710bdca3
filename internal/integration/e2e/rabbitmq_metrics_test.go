package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/promql/parser"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/backstop-dev/backstop/dashboards"
	"github.com/backstop-dev/backstop/exporter"
	"github.com/backstop-dev/backstop/internal/queuemetrics"
	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/internal/testing/rabbittest"
	"github.com/backstop-dev/backstop/rules"
)

// ruleAndPanelExprs returns the expression of every rule and every panel.
func ruleAndPanelExprs() []string {
	var exprs []string
	for _, f := range []rules.File{rules.Recording(rules.Default()), rules.Alerts(rules.Default())} {
		for _, r := range f.Groups[0].Rules {
			exprs = append(exprs, r.Expr)
		}
	}
	for _, d := range dashboards.All() {
		exprs = append(exprs, dashboards.Exprs(d)...)
	}
	return exprs
}

// eachSelector calls fn with the name of every metric a rule or panel
// selects and the expression that does; an expression that does not parse
// fails t.
func eachSelector(t *testing.T, fn func(expr, name string)) {
	t.Helper()
	p := parser.NewParser(parser.Options{})
	for _, e := range ruleAndPanelExprs() {
		expr, err := p.ParseExpr(e)
		if err != nil {
			t.Errorf("%v: %s", err, e)
			continue
		}
		parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
			if vs, ok := n.(*parser.VectorSelector); ok {
				fn(e, vs.Name)
			}
			return nil
		})
	}
}

// redisOnly are the queue metrics rules and panels name that a RabbitMQ
// deployment does not have, and why: their alerts stay silent and their
// panels empty there, which is right.
var redisOnly = map[string]string{
	"backstop_delayed_overdue_jobs":             "the broker moves due messages itself (TTL expiry): there is no promote loop to stall",
	"backstop_delayed_oldest_overdue_seconds":   "as backstop_delayed_overdue_jobs",
	"backstop_stream_pending_deliveries_bucket": "the management API does not show unacked messages' delivery counts; crash loops are dead-lettered by x-delivery-limit or the worker (backstop_dead_letters_total{reason=\"crash_loop\"})",
	"backstop_reclaim_skipped_total":            "there is no reclaim: the broker returns a dead consumer's messages",
	"backstop_force_run_total":                  "a Redis stats-hash counter; backstop queue run on RabbitMQ reports what it moved, and the broker counts nothing of it",
	"backstop_job_types":                        "the Redis stats hash's registry of job types; a RabbitMQ worker bounds job_type in its own process (queuemetrics.TypeLimit) and does not export the count",
	"backstop_job_types_overflow_total":         "as backstop_job_types",
	"backstop_redis_rejected_writes_total":      "Redis node metrics",
	"backstop_redis_evicted_keys_total":         "Redis node metrics",
	"backstop_redis_memory_used_bytes":          "Redis node metrics",
	"backstop_redis_memory_max_bytes":           "Redis node metrics",
}

// TestEveryNamedQueueMetricIsEmittedOnRabbitMQ proves that every queue
// metric a rule or panel names is, on RabbitMQ, in a real scrape of the
// exporter (--rabbitmq.url) over a queue with jobs, dead letters and a
// delayed retry, or in the workers' own families (internal/queuemetrics,
// which the Go RabbitMQ worker registers; Node and Python mirror them)
// after every outcome; or is one of redisOnly, each with its reason.
func TestEveryNamedQueueMetricIsEmittedOnRabbitMQ(t *testing.T) {
	b := rabbittest.Start(t)
	ch := b.Channel(t)
	// The parts of the topology (queue/rabbitmq/README.md) the exporter reads.
	_, err := ch.QueueDeclare("orders", true, false, false, false, amqp.Table{"x-queue-type": "quorum",
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "orders.dlq"})
	if err == nil {
		_, err = ch.QueueDeclare("orders.dlq", true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	}
	if err == nil {
		err = ch.ExchangeDeclare("orders.delay", "fanout", true, false, false, false, nil)
	}
	for _, dest := range []string{"orders", "orders.dlq"} {
		if err == nil {
			err = ch.PublishWithContext(context.Background(), "", dest, false, false, amqp.Publishing{MessageId: "job-1"})
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	c, err := exporter.NewRabbitMQCollector(b.ManagementURL(), exporter.WithRabbitMQCredentials("guest", "guest"), exporter.WithQueues(exporter.Queue{Name: "orders"}))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	emitted := map[string]bool{}
	eventually.True(t, 30*time.Second, "the broker's statistics of the dead letter", func() bool {
		clear(emitted)
		gatherNames(t, reg, emitted)
		return emitted["backstop_dlq_ingested_total"]
	})

	workers := prometheus.NewRegistry()
	m, err := queuemetrics.Bind(workers, "orders", "e2e")
	if err != nil {
		t.Fatal(err)
	}
	j := queuemetrics.Job{Type: "send_email", ValidType: true, Attempt: 3}
	m.Success(j)
	m.Retried(j, "transient")
	m.Deferred(j, "circuit_open")
	m.DeadLettered(j, "max_attempts_reached")
	gatherNames(t, workers, emitted)

	named, missing := 0, map[string]bool{}
	eachSelector(t, func(e, name string) {
		if strings.Contains(name, ":") || strings.HasPrefix(name, "backstop_client_") || strings.HasPrefix(name, "backstop_idempotency_") {
			return // recording rules' outputs, and the services' own metrics (TestEveryNamedMetricIsEmitted)
		}
		named++
		if emitted[name] {
			return
		}
		missing[name] = true
		if redisOnly[name] == "" {
			t.Errorf("%s names %s, which neither the exporter on RabbitMQ nor the workers emit", e, name)
		}
	})
	for name := range redisOnly {
		if !missing[name] {
			t.Errorf("%s is listed Redis-only but no rule or panel misses it on RabbitMQ: drop it from redisOnly", name)
		}
	}
	if named < 20 {
		t.Errorf("only %d queue metric selectors found in the rules and dashboards", named)
	}
}

// gatherNames adds the names of reg's series to names (a histogram's
// _bucket, _sum and _count).
func gatherNames(t *testing.T, reg prometheus.Gatherer, names map[string]bool) {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetType().String() != "HISTOGRAM" {
			names[f.GetName()] = true
			continue
		}
		for _, s := range []string{"_bucket", "_sum", "_count"} {
			names[f.GetName()+s] = true
		}
	}
}
