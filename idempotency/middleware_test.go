package idempotency_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/idempotency"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
)

type server struct {
	t     *testing.T
	url   string
	runs  atomic.Int64
	m     *idempotency.Metrics
	store *idempotency.Store
}

// newServer serves h behind the middleware over a real redis-server and
// counts the handler's runs.
func newServer(t *testing.T, h http.HandlerFunc, sopts []idempotency.Option, mopts ...idempotency.MiddlewareOption) *server {
	s := &server{t: t, m: idempotency.NewMetrics()}
	rdb := redistest.Start(t).Client()
	s.store = idempotency.New(rdb, append([]idempotency.Option{idempotency.WithMetrics(s.m)}, sopts...)...)
	srv := httptest.NewServer(idempotency.Middleware(s.store, mopts...)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.runs.Add(1)
		h(w, r)
	})))
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

func (s *server) post(key, body string) (*http.Response, string) {
	s.t.Helper()
	req, _ := http.NewRequest("POST", s.url+"/charges", strings.NewReader(body))
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func charge(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Not-Stored", "1")
	w.WriteHeader(201)
	io.WriteString(w, `{"charged":"`+string(b)+`"}`)
}

func TestMiddlewareReplaysConflictsAndCounts(t *testing.T) {
	s := newServer(t, charge, nil)
	r1, b1 := s.post("k1", "10")
	r2, b2 := s.post("k1", "10")
	if r1.StatusCode != 201 || r2.StatusCode != 201 || b1 != b2 || s.runs.Load() != 1 {
		t.Fatalf("first %d %q, retry %d %q, runs %d: want one run, the same 201 twice", r1.StatusCode, b1, r2.StatusCode, b2, s.runs.Load())
	}
	if r1.Header.Get(idempotency.ReplayedHeader) != "" || r2.Header.Get(idempotency.ReplayedHeader) != "true" {
		t.Errorf("replayed header: first %q, retry %q", r1.Header.Get(idempotency.ReplayedHeader), r2.Header.Get(idempotency.ReplayedHeader))
	}
	if r2.Header.Get("Content-Type") != "application/json" || r2.Header.Get("X-Not-Stored") != "" {
		t.Errorf("replayed headers %v: want the stored ones only", r2.Header)
	}
	if r, _ := s.post("k1", "99"); r.StatusCode != 422 {
		t.Errorf("same key, another body: %d, want 422", r.StatusCode)
	}
	if r, _ := s.post("", "10"); r.StatusCode != 201 || s.runs.Load() != 2 {
		t.Errorf("no key: %d after %d runs, want the handler run", r.StatusCode, s.runs.Load())
	}
	if r, _ := s.post(strings.Repeat("k", 256), "10"); r.StatusCode != 400 {
		t.Errorf("key of 256 bytes: %d, want 400", r.StatusCode)
	}
	for outcome, want := range map[string]float64{"first_run": 1, "replayed": 1, "conflict": 1, "in_progress": 0} {
		if got := testutil.ToFloat64(idempotency.MetricsRequests(s.m, outcome)); got != want {
			t.Errorf("requests_total{outcome=%q} = %v, want %v", outcome, got, want)
		}
	}
}

func TestMiddlewareDuplicateWhileInProgress(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{})
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
		charge(w, r)
	}, nil)
	done := make(chan string)
	go func() { _, b := s.post("k", "1"); done <- b }()
	<-started
	r, _ := s.post("k", "1")
	if r.StatusCode != 409 || r.Header.Get("Retry-After") != "30" {
		t.Errorf("duplicate in progress: %d Retry-After %q, want 409 and 30", r.StatusCode, r.Header.Get("Retry-After"))
	}
	close(release)
	first := <-done
	if r, b := s.post("k", "1"); r.StatusCode != 201 || b != first || s.runs.Load() != 1 {
		t.Errorf("after it finished: %d %q, runs %d", r.StatusCode, b, s.runs.Load())
	}
}

func TestMiddlewareReleasesRetryableFailuresAndPanics(t *testing.T) {
	var fail atomic.Int64
	fail.Store(2)
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch fail.Add(-1) {
		case 1:
			http.Error(w, "busy", 503)
		case 0:
			panic(http.ErrAbortHandler)
		default:
			charge(w, r)
		}
	}, nil)
	if r, _ := s.post("k", "1"); r.StatusCode != 503 {
		t.Fatalf("first: %d", r.StatusCode)
	}
	req, _ := http.NewRequest("POST", s.url+"/charges", strings.NewReader("1"))
	req.Header.Set("Idempotency-Key", "k")
	// A fresh connection: Go's transport resends a request carrying an
	// Idempotency-Key when a reused connection breaks.
	once := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	if _, err := once.Do(req); err == nil {
		t.Fatal("the panicking handler's request got a response")
	}
	if r, _ := s.post("k", "1"); r.StatusCode != 201 || s.runs.Load() != 3 {
		t.Errorf("after a 503 and a panic: %d after %d runs, want the third run to 201", r.StatusCode, s.runs.Load())
	}
}

func TestMiddlewareTooLargeIsNeverReplayedTruncated(t *testing.T) {
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, strings.Repeat("x", 2000)) },
		[]idempotency.Option{idempotency.WithMaxBody(1000)})
	if r, b := s.post("k", "1"); r.StatusCode != 200 || len(b) != 2000 {
		t.Fatalf("first: %d, %d bytes, want the whole 2000", r.StatusCode, len(b))
	}
	r, b := s.post("k", "1")
	if r.StatusCode != 500 || !strings.Contains(b, "too large") || s.runs.Load() != 1 {
		t.Errorf("retry: %d %q after %d runs, want 500 naming too large, no second run", r.StatusCode, b, s.runs.Load())
	}
	if got := testutil.ToFloat64(idempotency.MetricsRequests(s.m, "too_large")); got != 1 {
		t.Errorf("too_large = %v", got)
	}
}

func TestStoreUnreachable(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	m := idempotency.NewMetrics()
	// One dial per call: the server is gone, retries would only wait.
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { rdb.Close() })
	store := idempotency.New(rdb, idempotency.WithMetrics(m))
	c, err := store.Begin(ctx, "", "k", "r1")
	if err != nil || c.State != idempotency.Started {
		t.Fatalf("begin: %v %v", c, err)
	}
	srv.Stop() // Redis goes away mid-request
	if err := store.Complete(ctx, "", "k", c.Token, idempotency.Response{Status: 201}); err == nil || errors.Is(err, idempotency.ErrLeaseLost) {
		t.Errorf("complete with Redis gone: %v, want a store error", err)
	}
	for _, open := range []bool{false, true} {
		h := idempotency.Middleware(store, idempotency.WithFailOpen(open))(http.HandlerFunc(charge))
		w := httptest.NewRecorder()
		req := httptest.NewRequest("POST", "/charges", strings.NewReader("1"))
		req.Header.Set("Idempotency-Key", "k2")
		h.ServeHTTP(w, req)
		if want := map[bool]int{false: 503, true: 201}[open]; w.Code != want {
			t.Errorf("fail open %v: %d, want %d", open, w.Code, want)
		}
	}
	if got := testutil.ToFloat64(idempotency.MetricsStoreErrors(m, "begin")) + testutil.ToFloat64(idempotency.MetricsStoreErrors(m, "complete")); got != 3 {
		t.Errorf("store errors %v, want 3 (one complete, two begins)", got)
	}
}

func TestBadKeysAndOptions(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	for _, k := range []string{"", strings.Repeat("k", 256), "tab\tkey", "é"} {
		if _, err := idempotency.New(rdb).Begin(ctx, "", k, "r"); err == nil || !strings.Contains(err.Error(), "key must") {
			t.Errorf("key %q: %v, want an error naming the key", k, err)
		}
	}
	if _, err := idempotency.New(rdb, idempotency.WithLease(time.Hour), idempotency.WithRetention(time.Minute)).Begin(ctx, "", "k", "r"); err == nil ||
		!strings.Contains(err.Error(), "retention must be") {
		t.Errorf("retention under the lease: %v", err)
	}
	if _, err := idempotency.New(rdb).Begin(ctx, "", strings.Repeat("k", 255), "r"); err != nil {
		t.Errorf("key of 255 bytes: %v", err)
	}
}
