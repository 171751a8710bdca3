package console_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/console"
	"github.com/backstop-dev/backstop/exporter"
	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/internal/testing/rabbittest"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/rabbitmq"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

var shared rabbittest.Shared

func TestMain(m *testing.M) { os.Exit(shared.Run(m)) }

// brokers are the two brokers every console test runs on, each a real
// server on loopback.
var brokers = []struct {
	name string
	open func(t *testing.T) queue.Broker
	// withExporter opens the broker and returns with it the exporter's
	// collector of the queues it is given, reading the same server.
	withExporter func(t *testing.T) (queue.Broker, func(names ...string) *exporter.Collector)
}{
	{"redis", func(t *testing.T) queue.Broker {
		b, _ := openRedis(t)
		return b
	}, func(t *testing.T) (queue.Broker, func(names ...string) *exporter.Collector) {
		b, rdb := openRedis(t)
		return b, func(names ...string) *exporter.Collector {
			var qs []exporter.Queue
			for _, n := range names {
				qs = append(qs, exporter.QueueFor(n))
			}
			c, err := exporter.NewCollector(rdb, exporter.WithQueues(qs...))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return c
		}
	}},
	{"rabbitmq", openRabbit, func(t *testing.T) (queue.Broker, func(names ...string) *exporter.Collector) {
		return openRabbit(t), func(names ...string) *exporter.Collector {
			var qs []exporter.Queue
			for _, n := range names {
				qs = append(qs, exporter.Queue{Name: n})
			}
			c, err := exporter.NewRabbitMQCollector(shared.Broker(t).ManagementURL(), exporter.WithQueues(qs...), exporter.WithRabbitMQCredentials("guest", "guest"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return c
		}
	}},
}

func openRedis(t *testing.T) (queue.Broker, redis.UniversalClient) {
	srv := redistest.Start(t)
	b := redisqueue.NewBroker(srv.Client())
	t.Cleanup(func() { b.Close() })
	return b, srv.Client()
}

func openRabbit(t *testing.T) queue.Broker {
	b, err := rabbitmq.Open(context.Background(), shared.Broker(t).URL(), rabbitmq.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// Hostile strings: a payload and an error that would run a script or end
// the payload's textarea if they were not escaped.
const (
	hostilePayload = `</textarea><script>document.title="pwned-payload"</script><img src=x onerror=alert(1)>`
	hostileError   = `</textarea><script>document.title="pwned-error"</script>`
)

// letter is one job seeded into a DLQ.
type letter struct {
	id, typ string
	payload []byte
}

// seedLetters makes ls dead letters of q the way a worker does: each job
// enqueued, worked once by a handler that fails for good with
// hostileError.
func seedLetters(t *testing.T, q queue.Queue, ls []letter) {
	t.Helper()
	ctx := context.Background()
	for _, l := range ls {
		if _, err := q.Enqueue(ctx, l.id, l.payload, queue.EnqueueOptions{Type: l.typ}); err != nil {
			t.Fatal(err)
		}
	}
	fail := func(context.Context, queue.Job) error {
		return &backstop.Failure{HTTPStatus: 400, Err: errors.New(hostileError)}
	}
	stop := work(t, q, `{"max_attempts": 1}`, fail)
	defer stop()
	eventually.True(t, 30*time.Second, fmt.Sprintf("%d dead letters in %s", len(ls), q.Name()), func() bool {
		st, err := q.Stats(ctx)
		return err == nil && st.DeadLetters == int64(len(ls)) && st.Jobs == 0
	})
}

// work runs q's worker under policy js until stop.
func work(t *testing.T, q queue.Queue, js string, h queue.Handler) (stop func()) {
	t.Helper()
	p, err := policy.Parse([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- q.Work(ctx, backstop.Native(p), h, queue.WorkOptions{Concurrency: 2, Logger: slog.New(slog.DiscardHandler)})
	}()
	return func() { cancel(); <-done }
}

// site is a console under test.
type site struct {
	t   *testing.T
	srv *httptest.Server
}

func serve(t *testing.T, kind string, qs []queue.Queue, opts ...console.Option) *site {
	t.Helper()
	h, err := console.New(kind, qs, append([]console.Option{console.WithLogger(slog.New(slog.DiscardHandler))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() }) // after the server's: stops the history's sampling (WithExporter)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &site{t: t, srv: srv}
}

var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

func (s *site) get(path string) (int, string) {
	s.t.Helper()
	resp, err := noRedirect.Get(s.srv.URL + path)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (s *site) post(path string, form url.Values) (int, string, string) {
	s.t.Helper()
	resp, err := noRedirect.PostForm(s.srv.URL+path, form)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header.Get("Location")
}

var csrfField = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// token reads the CSRF token from a page of the console.
func (s *site) token(path string) string {
	s.t.Helper()
	_, body := s.get(path)
	m := csrfField.FindStringSubmatch(body)
	if m == nil {
		s.t.Fatalf("no CSRF token on %s", path)
	}
	return m[1]
}

// dlqSize is q's DLQ size once it reads want, else the last it read: a
// broker's figures may lag a move a moment (RabbitMQ applies an ack, and
// counts a dead letter a page put back at the tail, a little later).
func dlqSize(t *testing.T, q queue.Queue, want int64) int64 {
	t.Helper()
	var n int64
	eventually.Wait(10*time.Second, func() bool {
		st, err := q.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		n = st.DeadLetters
		return n == want
	})
	return n
}

func mustContain(t *testing.T, what, body string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(body, w) {
			t.Errorf("%s lacks %q", what, w)
		}
	}
}

func mustNotContain(t *testing.T, what, body string, nots ...string) {
	t.Helper()
	for _, w := range nots {
		if strings.Contains(body, w) {
			t.Errorf("%s holds %q", what, w)
		}
	}
}

func readAll(t testing.TB, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
