package exporter_test

import (
	"log"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/exporter"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// Serve the metrics of two queues in the default layout, one existing
// layout, and every queue found by the pattern {*}:jobs.
func ExampleNewCollector() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	legacy := exporter.Queue{
		Name:   "legacy",
		Keys:   redisqueue.Keys{Jobs: "jobs:main", Delayed: "delayed:retries", DLQ: "jobs:dlq"},
		Groups: []string{"workers", "audit"},
	}
	c, err := exporter.NewCollector(rdb,
		exporter.WithQueues(exporter.QueueFor("orders"), exporter.QueueFor("emails"), legacy),
		exporter.WithPattern("{*}:jobs", time.Minute, 10000),
		exporter.WithTimeout(5*time.Second),
		exporter.WithLogger(slog.Default()),
	)
	if err != nil {
		log.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
}

// Serve the metrics the way backstop-exporter does: concurrent scrapes
// share one collection and one encoded body.
func ExampleCollector_Handler() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	c, err := exporter.NewCollector(rdb, exporter.WithQueues(exporter.QueueFor("orders")))
	if err != nil {
		log.Fatal(err)
	}
	runtime := prometheus.NewRegistry()
	runtime.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	http.Handle("/metrics", c.Handler(runtime))
}
