package exporter

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/resp"
	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// serve serves c the way cmd/backstop-exporter does, with the Go
// runtime's collector beside it.
func serve(t *testing.T, c *Collector) string {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector())
	srv := httptest.NewServer(c.Handler(reg))
	t.Cleanup(srv.Close)
	return srv.URL
}

// scrapeHTTP GETs url, requires a 200 and parses the text exposition.
func scrapeHTTP(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	must(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	must(t, err)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s\n%s", url, resp.Status, body)
	}
	p := expfmt.NewTextParser(model.LegacyValidation) // classic names only
	mfs, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("exposition does not parse: %v\n%s", err, body)
	}
	out := map[string]float64{}
	for name, mf := range mfs {
		for _, m := range mf.GetMetric() {
			k := series(name, labelPairs(m.GetLabel()))
			switch {
			case m.Gauge != nil:
				out[k] = m.GetGauge().GetValue()
			case m.Counter != nil:
				out[k] = m.GetCounter().GetValue()
			case m.Untyped != nil:
				out[k] = m.GetUntyped().GetValue()
			}
		}
	}
	return out
}

// TestRedisRestart stops Redis under a running exporter: the scrape still
// answers 200 with backstop_up 0 and a connection error counted, and once
// Redis is back the exporter reconnects by itself.
func TestRedisRestart(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	// The default budget (5s) outlasts go-redis's default dial retries
	// (about 2.5s against a refused port), so the error is a connection one.
	c, logs := newTestCollector(t, rdb, WithQueues(QueueFor("orders")))
	url := serve(t, c)

	want(t, scrapeHTTP(t, url), map[string]float64{"backstop_up": 1, `backstop_scrape_errors_total{kind="connection"}`: 0})
	srv.Stop()
	want(t, scrapeHTTP(t, url), map[string]float64{
		"backstop_up": 0, "backstop_scrape_partial": 1, `backstop_scrape_errors_total{kind="connection"}`: 1,
	}, `backstop_dlq_size{queue="orders"}`)
	if !strings.Contains(logs.String(), `msg="scrape failed" kind=connection`) {
		t.Errorf("no log line for the failed scrape:\n%s", logs)
	}
	srv.Restart()
	// The pool redials on its own; give it a few scrapes.
	var got map[string]float64
	eventually.True(t, 10*time.Second, "the exporter to reconnect", func() bool {
		got = scrapeHTTP(t, url)
		return got["backstop_up"] == 1
	})
	want(t, got, map[string]float64{"backstop_scrape_partial": 0, `backstop_dlq_size{queue="orders"}`: 0})
}

// TestWrongType puts keys of the wrong type where the layout expects a
// stream, a set and a hash: each gives a log line naming the key and the
// error metric, and the other queues are still reported.
func TestWrongType(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	k := redisqueue.KeysFor("broken")
	must(t, rdb.Set(ctx, k.Jobs, "not a stream", 0).Err())
	must(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: k.Delayed, Values: []string{"a", "b"}}).Err())
	must(t, rdb.HSet(ctx, k.DLQ, "a", "b").Err())
	must(t, rdb.RPush(ctx, k.Stats, "a").Err())
	c, logs := newTestCollector(t, rdb, WithQueues(QueueFor("broken"), QueueFor("fine")))

	want(t, scrapeHTTP(t, serve(t, c)), map[string]float64{
		"backstop_up": 1, "backstop_scrape_partial": 0,
		`backstop_scrape_errors_total{kind="wrong_type"}`: 1,
		`backstop_dlq_size{queue="fine"}`:                 0,
	}, `backstop_dlq_size{queue="broken"}`, `backstop_delayed_queue_size{queue="broken"}`)
	for _, key := range []string{k.Jobs, k.Delayed, k.DLQ, k.Stats} {
		if !strings.Contains(logs.String(), "key="+key+" kind=wrong_type") {
			t.Errorf("no log line for %s:\n%s", key, logs)
		}
	}
}

// TestWrongPassword reports an authentication failure as backstop_up 0
// and an auth error.
func TestWrongPassword(t *testing.T) {
	srv := redistest.Start(t)
	// Set the password after start: redistest's readiness check has none.
	must(t, srv.Client().ConfigSet(context.Background(), "requirepass", "right").Err())
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: "wrong"})
	t.Cleanup(func() { rdb.Close() })
	c, logs := newTestCollector(t, rdb, WithQueues(QueueFor("orders")))
	want(t, scrapeHTTP(t, serve(t, c)), map[string]float64{"backstop_up": 0, `backstop_scrape_errors_total{kind="auth"}`: 1})
	if !strings.Contains(logs.String(), "kind=auth") {
		t.Errorf("no log line for the auth failure:\n%s", logs)
	}
}

// blockHook holds every pipeline of queue reads until released, ignoring
// contexts like a client without ContextTimeoutEnabled would; entered gets
// one value per pipeline. The nodes' INFO pipeline passes, and so does the
// handshake of a new connection (CLIENT SETINFO).
type blockHook struct {
	release chan struct{}
	entered chan struct{}
	once    sync.Once
	pass    atomic.Int64 // pipelines to let through before holding them
}

// passes are the first commands of the pipelines a blockHook lets through.
var passes = map[string]bool{"info": true, "client": true, "hello": true, "auth": true, "select": true}

func newBlockHook() *blockHook {
	return &blockHook{release: make(chan struct{}), entered: make(chan struct{}, 100)}
}

func (h *blockHook) Release() { h.once.Do(func() { close(h.release) }) }

func (h *blockHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *blockHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *blockHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && passes[cmds[0].Name()] || h.pass.Add(-1) >= 0 {
			return next(ctx, cmds)
		}
		h.entered <- struct{}{}
		<-h.release
		return next(ctx, cmds)
	}
}

// TestBudget holds Redis's answer past the scrape's budget: the scrape
// returns on time and says it is partial.
func TestBudget(t *testing.T) {
	rdb := redistest.Start(t).Client()
	hook := newBlockHook()
	rdb.AddHook(hook)
	t.Cleanup(hook.Release)
	c, logs := newTestCollector(t, rdb, WithClientPipelines(), WithQueues(QueueFor("orders")), WithTimeout(200*time.Millisecond))

	start := time.Now()
	got := gather(t, c)
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("scrape took %v, budget 200ms", took)
	}
	want(t, got, map[string]float64{
		"backstop_up": 0, "backstop_scrape_partial": 1, `backstop_scrape_errors_total{kind="timeout"}`: 1,
		`backstop_scrape_limit_reached{limit="timeout"}`: 1,
	}, `backstop_dlq_size{queue="orders"}`)
	if !strings.Contains(logs.String(), "kind=timeout") {
		t.Errorf("no log line for the timeout:\n%s", logs)
	}
}

// TestBudgetOwnConnection holds a real Redis busy (DEBUG SLEEP 2) past the
// budget of a scrape over the collector's own connection: the scrape
// returns on time and says it is partial, and the next one, once Redis
// answers again, is whole over a new connection.
func TestBudgetOwnConnection(t *testing.T) {
	srv := redistest.Start(t, "--enable-debug-command", "yes")
	rdb := srv.Client()
	c, logs := newTestCollector(t, rdb, WithQueues(QueueFor("orders")), WithTimeout(300*time.Millisecond))
	if _, ok := transportOf(c).(*resp.ConnTransport); !ok {
		t.Fatalf("transport %T, want the collector's own connection", transportOf(c))
	}
	want(t, gather(t, c), map[string]float64{"backstop_up": 1, `backstop_dlq_size{queue="orders"}`: 0})

	admin := srv.Client()
	slept := make(chan error, 1)
	go func() { slept <- admin.Do(context.Background(), "DEBUG", "SLEEP", "2").Err() }()
	probe := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: 50 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { probe.Close() })
	eventually.True(t, 5*time.Second, "Redis to be asleep", func() bool {
		return isTimeout(probe.Ping(context.Background()).Err())
	})
	got := gather(t, c)
	if len(slept) != 0 {
		t.Errorf("the scrape waited for Redis to wake up")
	}
	want(t, got, map[string]float64{
		"backstop_up": 0, "backstop_scrape_partial": 1, `backstop_scrape_errors_total{kind="timeout"}`: 1,
	}, `backstop_dlq_size{queue="orders"}`)
	if !strings.Contains(logs.String(), "kind=timeout") {
		t.Errorf("no log line for the timeout:\n%s", logs)
	}
	must(t, <-slept)
	want(t, gather(t, c), map[string]float64{"backstop_up": 1, "backstop_scrape_partial": 0, `backstop_dlq_size{queue="orders"}`: 0})
}

// TestOwnConnectionAfterRestart restarts Redis between two scrapes of
// three pipelines: the kept connection is dead, and the scrape dials a
// new one and reports every queue, with no error.
func TestOwnConnectionAfterRestart(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	qs := fill(t, rdb, "q", 250, 3, 1)
	c, _ := newTestCollector(t, rdb, WithQueues(qs...))
	want(t, gather(t, c), map[string]float64{"backstop_up": 1, `backstop_dlq_size{queue="q249"}`: 2})
	srv.Restart() // empty: the test server does not persist
	want(t, gather(t, c), map[string]float64{
		"backstop_up": 1, "backstop_scrape_partial": 0, `backstop_scrape_errors_total{kind="connection"}`: 0,
		`backstop_dlq_size{queue="q0"}`: 0, `backstop_dlq_size{queue="q249"}`: 0,
	})
}

// TestDLQIngestionOutOfTime asks for the DLQ ingestion with a budget
// already spent: nothing is sent, and every queue says it ran out of
// time, not that Redis did not answer.
func TestDLQIngestionOutOfTime(t *testing.T) {
	rdb := redistest.Start(t).Client()
	prepareOrders(t, rdb)
	c, _ := newTestCollector(t, rdb, WithQueues(QueueFor("orders"), QueueFor("emails")))
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	out, err := c.DLQIngestion(ctx)
	must(t, err)
	if len(out) != 2 {
		t.Fatalf("%d queues read, want 2", len(out))
	}
	for _, q := range out {
		if kindOf(q.Err) != kindTimeout {
			t.Errorf("queue %s: %v (kind %s), want a timeout", q.Queue, q.Err, kindOf(q.Err))
		}
	}
}
