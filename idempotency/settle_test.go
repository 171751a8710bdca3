package idempotency_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/idempotency"
	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
)

// logs is a slog.Logger writing to a buffer the test reads while the
// store's goroutines write it.
type logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logs) Write(p []byte) (int, error) { l.mu.Lock(); defer l.mu.Unlock(); return l.buf.Write(p) }
func (l *logs) String() string              { l.mu.Lock(); defer l.mu.Unlock(); return l.buf.String() }
func (l *logs) logger() *slog.Logger        { return slog.New(slog.NewTextHandler(l, nil)) }

// persisted starts a redis-server that keeps its data across Restart
// (fsync on every write), as a production Redis with AOF does.
func persisted(t *testing.T) *redistest.Server {
	return redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
}

func retry(t *testing.T, url string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("POST", url+"/charges", strings.NewReader("10"))
	req.Header.Set("Idempotency-Key", "k")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// A client that times out while the handler runs (the case idempotency
// keys exist for): the handler finishes after the request's context is
// cancelled, and its response is still stored, so the client's retry gets
// it instead of a 409 and, after the lease, a second charge.
func TestMiddlewareCompletesForAClientThatTimedOut(t *testing.T) {
	rdb := redistest.Start(t).Client()
	store := idempotency.New(rdb, idempotency.WithMetrics(idempotency.NewMetrics()))
	var runs atomic.Int64
	started, served := make(chan struct{}), make(chan struct{}, 1)
	mw := idempotency.Middleware(store)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-r.Context().Done() // the client has gone
		runs.Add(1)
		w.Header().Set("Location", "/charges/1")
		w.WriteHeader(201)
	}))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mw.ServeHTTP(w, r)
		served <- struct{}{}
	}))
	t.Cleanup(srv.Close)

	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/charges", strings.NewReader("10"))
	req.Header.Set("Idempotency-Key", "k")
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-started
	cancel() // the client's timeout
	if err := <-errc; err == nil {
		t.Fatal("the cancelled request got a response")
	}
	<-served
	r := retry(t, srv.URL)
	if r.StatusCode != 201 || r.Header.Get(idempotency.ReplayedHeader) != "true" || r.Header.Get("Location") != "/charges/1" || runs.Load() != 1 {
		t.Errorf("retry: %d, replayed %q, location %q, %d runs: want the stored 201 replayed, one run",
			r.StatusCode, r.Header.Get(idempotency.ReplayedHeader), r.Header.Get("Location"), runs.Load())
	}
}

// Redis goes away between begin and complete: the client gets its
// response, and the record is completed once Redis is back (the store call
// is retried while the lease lasts), so a retry is replayed, not run again.
func TestMiddlewareCompletesAfterTheStoreComesBack(t *testing.T) {
	redisSrv := persisted(t)
	m, log := idempotency.NewMetrics(), &logs{}
	store := idempotency.New(redisSrv.Client(), idempotency.WithMetrics(m), idempotency.WithLogger(log.logger()))
	var runs atomic.Int64
	srv := httptest.NewServer(idempotency.Middleware(store)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		redisSrv.Stop() // between begin and complete
		w.WriteHeader(201)
	})))
	t.Cleanup(srv.Close)
	if r := retry(t, srv.URL); r.StatusCode != 201 {
		t.Fatalf("first: %d, want 201 (the response, whatever the store did)", r.StatusCode)
	}
	if got := testutil.ToFloat64(idempotency.MetricsStoreErrors(m, "complete")); got < 1 {
		t.Fatalf("store errors{complete} = %v: the first complete did not fail", got)
	}
	redisSrv.Restart()
	check := redis.NewClient(&redis.Options{Addr: redisSrv.Addr})
	t.Cleanup(func() { check.Close() })
	eventually.True(t, 20*time.Second, "the record completed", func() bool {
		return check.HGet(context.Background(), store.RecordKey("", "k"), "state").Val() == "completed"
	})
	r := retry(t, srv.URL)
	if r.StatusCode != 201 || r.Header.Get(idempotency.ReplayedHeader) != "true" || runs.Load() != 1 {
		t.Errorf("retry: %d, replayed %q, %d runs: want the stored 201, one run", r.StatusCode, r.Header.Get(idempotency.ReplayedHeader), runs.Load())
	}
	for _, want := range []string{"store call failed after the handler ran", "store call succeeded after retries", "op=complete", "key=k"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("log %q: want %q", log.String(), want)
		}
	}
}

// A store still down when the lease ends: the retries stop, the outcome is
// logged, and once Redis is back the key runs again (at least once: the
// documented outcome).
func TestMiddlewareGivesUpWhenTheLeaseEnds(t *testing.T) {
	redisSrv := persisted(t)
	log := &logs{}
	store := idempotency.New(redisSrv.Client(), idempotency.WithMetrics(idempotency.NewMetrics()), idempotency.WithLogger(log.logger()),
		idempotency.WithLease(300*time.Millisecond))
	var runs atomic.Int64
	srv := httptest.NewServer(idempotency.Middleware(store)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			redisSrv.Stop()
		}
		w.WriteHeader(201)
	})))
	t.Cleanup(srv.Close)
	retry(t, srv.URL)
	eventually.True(t, 20*time.Second, "the retries to give up", func() bool { return strings.Contains(log.String(), "the key may run again") })
	redisSrv.Restart()
	var r *http.Response // 409 until the lease is over on the server's clock too
	eventually.True(t, 20*time.Second, "the lease to end", func() bool { r = retry(t, srv.URL); return r.StatusCode != 409 })
	if r.StatusCode != 201 || r.Header.Get(idempotency.ReplayedHeader) != "" || runs.Load() != 2 {
		t.Errorf("after the lease: %d, replayed %q, %d runs: want a second run", r.StatusCode, r.Header.Get(idempotency.ReplayedHeader), runs.Load())
	}
}

// The worker's side: Redis goes away while fn runs; Once completes the
// record once it is back, so the redelivered job returns the result.
func TestOnceCompletesAfterTheStoreComesBack(t *testing.T) {
	redisSrv := persisted(t)
	m := idempotency.NewMetrics()
	store := idempotency.New(redisSrv.Client(), idempotency.WithMetrics(m), idempotency.WithLogger(slog.New(slog.DiscardHandler)))
	effects := 0
	charge := func(context.Context) ([]byte, error) { effects++; return []byte("charged"), nil }
	errc := make(chan error, 1)
	go func() {
		_, err := store.Once(context.Background(), "jobs", "j1", "j1", func(ctx context.Context) ([]byte, error) {
			redisSrv.Stop()
			return charge(ctx)
		})
		errc <- err
	}()
	eventually.True(t, 20*time.Second, "a failed complete", func() bool { return testutil.ToFloat64(idempotency.MetricsStoreErrors(m, "complete")) >= 1 })
	redisSrv.Restart()
	if err := <-errc; err != nil {
		t.Fatalf("Once: %v, want the result stored once Redis is back", err)
	}
	if out, err := store.Once(context.Background(), "jobs", "j1", "j1", charge); err != nil || string(out) != "charged" || effects != 1 {
		t.Errorf("redelivery: %q %v, %d effects: want the recorded result, one effect", out, err, effects)
	}
}

// A worker's deadline cancels fn's context: the result fn returns is still
// stored, not lost with the cancelled context.
func TestOnceCompletesWithACancelledContext(t *testing.T) {
	store := idempotency.New(redistest.Start(t).Client(), idempotency.WithMetrics(idempotency.NewMetrics()))
	ctx, cancel := context.WithCancel(context.Background())
	effects := 0
	_, err := store.Once(ctx, "jobs", "j1", "j1", func(context.Context) ([]byte, error) {
		effects++
		cancel() // the handler's deadline passes as fn returns
		return []byte("charged"), nil
	})
	if err != nil {
		t.Fatalf("Once: %v", err)
	}
	out, err := store.Once(context.Background(), "jobs", "j1", "j1", func(context.Context) ([]byte, error) { effects++; return nil, nil })
	if err != nil || string(out) != "charged" || effects != 1 {
		t.Errorf("redelivery: %q %v, %d effects: want the recorded result", out, err, effects)
	}
	if _, err := store.Once(context.Background(), "jobs", "j2", "j2", func(context.Context) ([]byte, error) {
		return nil, errors.New("declined")
	}); err == nil || err.Error() != "declined" {
		t.Errorf("failing fn: %v, want its error alone", err)
	}
}
