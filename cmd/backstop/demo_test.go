package main

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/exporter"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// The demo drains: every produced job succeeds or is dead-lettered, and
// the exporter's counters say the same as the demo's summary.
func TestDemoDrainsAndTheExporterAgrees(t *testing.T) {
	srv := redistest.Start(t)
	out, err := runCLI(t, "", "demo", "--jobs", "300", "--listen", "127.0.0.1:0", "--redis.url", "redis://"+srv.Addr+"/0")
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`summary: (\d+) produced, (\d+) succeeded, (\d+) dead-lettered, \d+ retries`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no summary:\n%s", out)
	}
	n := func(i int) float64 { v, _ := strconv.Atoi(m[i]); return float64(v) }
	if n(1) != 300 || n(2)+n(3) != 300 || strings.Contains(out, "not finished") {
		t.Fatalf("summary %q: produced must equal succeeded + dead-lettered", m[0])
	}

	var qs []exporter.Queue
	for _, dq := range demoQueues {
		qs = append(qs, exporter.QueueFor("demo-"+dq.name))
	}
	c, err := exporter.NewCollector(redis.NewClient(&redis.Options{Addr: srv.Addr}), exporter.WithQueues(qs...))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sums := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != "backstop_attempts_total" {
			continue
		}
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "outcome" {
					sums[l.GetValue()] += s.GetCounter().GetValue()
				}
			}
		}
	}
	if sums["success"] != n(2) || sums["dead_letter"] != n(3) {
		t.Errorf("exporter says %v; the demo says %s", sums, m[0])
	}
}

// Issue 15 (class of item 11): demo's --jobs (an entry in Redis each) and
// --workers (a goroutine each) are bounded, with an error naming the flag,
// before it touches Redis.
func TestDemoBoundsItsFlags(t *testing.T) {
	for _, c := range []struct{ flag, value, want string }{
		{"--jobs", "1000001", "--jobs: must be in 1..1000000 (got 1000001)"},
		{"--jobs", "0", "--jobs: must be in 1..1000000 (got 0)"},
		{"--workers", "65", "--workers: must be in 1..64 (got 65)"},
		{"--workers", "10000000", "--workers: must be in 1..64 (got 10000000)"},
		{"--workers", "0", "--workers: must be in 1..64 (got 0)"},
		{"--duration", "-1s", "--duration: must be >= 0 (got -1s)"},
	} {
		// Nothing listens on port 1: a demo that got as far as Redis fails otherwise.
		_, err := runCLI(t, "", "demo", c.flag, c.value, "--listen", "127.0.0.1:0", "--redis.url", "redis://127.0.0.1:1/0")
		if err == nil || err.Error() != c.want {
			t.Errorf("%s %s: %v, want %s", c.flag, c.value, err, c.want)
		}
	}
}

// Issue 13: without --jobs the demo keeps going, a trickle of new jobs,
// and takes the payments downstream down now and then: its breaker opens
// and jobs are deferred (circuit_open) until it half-opens, as an operator
// would see them.
// The intervals are shortened here; --duration ends the run.
func TestDemoKeepsGoingWithOutages(t *testing.T) {
	defer func(tr, every, dur time.Duration) { demoTrickle, demoOutageEvery, demoOutageFor = tr, every, dur }(demoTrickle, demoOutageEvery, demoOutageFor)
	demoTrickle, demoOutageEvery, demoOutageFor = 10*time.Millisecond, 1500*time.Millisecond, time.Second
	srv := redistest.Start(t)
	out, err := runCLI(t, "", "demo", "--duration", "4s", "--listen", "127.0.0.1:0", "--redis.url", "redis://"+srv.Addr+"/0")
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out)
	}
	for _, want := range []string{"demo-payments   payments", "demo-emails     emails", "Redis: redis://" + srv.Addr + "/0",
		// Issue 42: a Redis of the user's is told which keys the demo overwrites.
		"the demo deletes and rewrites its keys there: {demo-payments}, {demo-emails}, {demo-reports}, each :jobs, :delayed, :dlq and :stats",
		"produced  success   queued retrying deferred  retry/s     dead",
		"dlq inspect --redis.url redis://" + srv.Addr + "/0 --queue demo-payments"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	s, err := redisqueue.New(rdb, "demo-payments").Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// The breaker defers jobs (on_open: defer, the default): they wait in
	// the delayed set without spending an attempt, never dead-lettered for it.
	if s.Counters["deferred:circuit_open"] == 0 || s.Counters["dead_letters:circuit_open"] != 0 {
		t.Errorf("want circuit_open deferrals and no circuit_open dead letters on demo-payments: %v\n%s", s.Counters, out)
	}
	if s.Counters["enqueued"] <= 100 {
		t.Errorf("%d jobs enqueued on demo-payments, want a steady trickle", s.Counters["enqueued"])
	}
}
