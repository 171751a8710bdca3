package alerter

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-openapi/strfmt"
	"github.com/prometheus/alertmanager/api/v2/models"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/exporter"
	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/queue/redisqueue"
	"github.com/backstop-dev/backstop/rules"
)

// fakeAM stands in for Alertmanager's POST /api/v2/alerts and records
// every alert posted, after decoding and validating it with Alertmanager's
// own API models, as its server does. While fail is set it answers 500.
type fakeAM struct {
	*httptest.Server
	fail  atomic.Bool
	mu    sync.Mutex
	posts []models.PostableAlert
	at    []time.Time // when each post arrived
}

func newFakeAM(t *testing.T) *fakeAM {
	am := &fakeAM{}
	am.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/api/v2/alerts" {
			t.Errorf("unexpected request %s %s", r.Method, r.URL.Path)
			http.NotFound(w, r)
			return
		}
		if am.fail.Load() {
			http.Error(w, "down for the test", http.StatusInternalServerError)
			return
		}
		var alerts []models.PostableAlert
		if err := json.NewDecoder(r.Body).Decode(&alerts); err != nil {
			t.Errorf("decode posted alerts: %v", err)
		}
		for i := range alerts {
			if err := alerts[i].Validate(strfmt.Default); err != nil {
				t.Errorf("posted alert %+v is not valid: %v", alerts[i], err)
			}
		}
		am.mu.Lock()
		am.posts = append(am.posts, alerts...)
		for range alerts {
			am.at = append(am.at, time.Now())
		}
		am.mu.Unlock()
	}))
	t.Cleanup(am.Close)
	return am
}

func (am *fakeAM) all() []models.PostableAlert {
	am.mu.Lock()
	defer am.mu.Unlock()
	return append([]models.PostableAlert(nil), am.posts...)
}

// waitFor polls until cond holds for a posted alert and returns it; it
// fails the test after a generous limit (not a latency assertion).
func (am *fakeAM) waitFor(t *testing.T, what string, cond func(a models.PostableAlert, firing bool) bool) models.PostableAlert {
	t.Helper()
	var found models.PostableAlert
	eventually.True(t, 20*time.Second, "a posted alert "+what, func() bool {
		am.mu.Lock()
		posts, at := append([]models.PostableAlert(nil), am.posts...), append([]time.Time(nil), am.at...)
		am.mu.Unlock()
		for i, a := range posts {
			// Firing when it arrived: it ends after that (a resolve ends before).
			if cond(a, time.Time(a.EndsAt).After(at[i])) {
				found = a
				return true
			}
		}
		return false
	})
	return found
}

// TestAlerterFiresAndResolves: the first read is only a baseline; growth
// posts the rule's alert; quiet for the resolve window resolves it.
func TestAlerterFiresAndResolves(t *testing.T) {
	rdb := redistest.Start(t).Client()
	am := newFakeAM(t)
	for range 3 { // old dead letters: they must not page
		addDeadLetter(t, rdb, "orders")
	}
	a, _ := newTestAlerter(t, rdb, am.URL, WithInterval(20*time.Millisecond), WithResolveAfter(300*time.Millisecond),
		WithURLs("https://example.com/runbooks.md", "https://grafana.example.com"), WithConsoleURL("https://console.example.com"))

	// Baseline: driven by hand so "no post" is exact, not timing.
	ctx := context.Background()
	a.tick(ctx)
	a.tick(ctx)
	if got := am.all(); len(got) != 0 {
		t.Fatalf("posted on the baseline: %+v", got)
	}

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	// Two dead letters in one MULTI, so no read falls between them.
	_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for range 2 {
			p.XAdd(ctx, &redis.XAddArgs{Stream: redisqueue.KeysFor("orders").DLQ, Values: []any{"reason", "permanent_error"}})
		}
		return nil
	})
	must(t, err)
	page := am.waitFor(t, "firing for orders", func(a models.PostableAlert, firing bool) bool {
		return a.Labels["queue"] == "orders" && firing
	})
	wantLabels := models.LabelSet{"alertname": "BackstopDLQIngestion", "severity": "critical", "queue": "orders"}
	// The rule-based alert's labels, so Alertmanager deduplicates the two.
	rule, ok := rules.Alerts(rules.Default()).Alert(rules.AlertDLQIngestion)
	if !ok || rule.Alert != wantLabels["alertname"] {
		t.Fatalf("the rules have no alert %s", wantLabels["alertname"])
	}
	for k, v := range rule.Labels {
		if wantLabels[k] != v {
			t.Errorf("the rule's label %s=%q is not the alert's %q", k, v, wantLabels[k])
		}
	}
	if len(page.Labels) != len(wantLabels) {
		t.Errorf("labels %v, want exactly %v", page.Labels, wantLabels)
	}
	for k, v := range wantLabels {
		if page.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, page.Labels[k], v)
		}
	}
	if got := page.Annotations["runbook_url"]; got != "https://example.com/runbooks.md#backstopdlqingestion" {
		t.Errorf("runbook_url %q", got)
	}
	if got := page.Annotations["dashboard_url"]; got != "https://grafana.example.com/d/backstop-queue/backstop-queue?var-queue=orders" {
		t.Errorf("dashboard_url %q", got)
	}
	// The console's list of the queue's dead letters, as the rule links.
	if got := page.Annotations["console_url"]; got != "https://console.example.com/queues/orders/dlq" {
		t.Errorf("console_url %q", got)
	}
	if got := page.Annotations["summary"]; !strings.Contains(got, "orders") {
		t.Errorf("summary %q", got)
	}
	if got := page.Annotations["description"]; !strings.Contains(got, "dead-lettered 2 jobs") {
		t.Errorf("description %q does not count the 2 new dead letters", got)
	}
	starts := time.Time(page.StartsAt)

	resolved := am.waitFor(t, "resolving orders", func(a models.PostableAlert, firing bool) bool {
		return a.Labels["queue"] == "orders" && !firing
	})
	if !time.Time(resolved.StartsAt).Equal(starts) {
		t.Errorf("resolve startsAt %v, want the first growth %v", time.Time(resolved.StartsAt), starts)
	}
	if d := time.Time(resolved.EndsAt).Sub(starts); d < 300*time.Millisecond {
		t.Errorf("resolved %v after the first growth, before the resolve window", d)
	}
	for _, p := range am.all() {
		if p.Labels["queue"] != "orders" {
			t.Errorf("alert for a queue without new dead letters: %+v", p)
		}
	}
}

// TestAlerterErrors: Alertmanager and Redis failures are logged and
// counted, and the alerter keeps going and pages once they pass.
func TestAlerterErrors(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, DialerRetries: 1, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	am := newFakeAM(t)
	am.fail.Store(true)
	a, logs := newTestAlerter(t, rdb, am.URL, WithInterval(20*time.Millisecond), WithResolveAfter(time.Hour))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()

	waitLog := func(msg string) {
		t.Helper()
		eventually.True(t, 20*time.Second, "log "+msg, func() bool {
			return strings.Contains(logs.String(), `msg="`+msg+`"`)
		})
	}

	// Redis down: logged and counted.
	srv.Stop()
	waitLog("alerter reading dlq failed")
	srv.Restart() // empty: the test server does not persist, the DLQ is new
	rdb2 := srv.Client()
	// Wait for a good read (the baseline of the new DLQ at 0) before growing it.
	eventually.True(t, 20*time.Second, "the alerter to read Redis again", func() bool {
		a.mu.Lock()
		w := a.state["orders"]
		ok := w != nil && w.added == 0
		a.mu.Unlock()
		return ok && rdb.Ping(context.Background()).Err() == nil
	})

	// Alertmanager down: the growth is posted again until it is taken.
	addDeadLetter(t, rdb2, "orders")
	waitLog("posting alerts to alertmanager failed")
	am.fail.Store(false)
	am.waitFor(t, "firing for orders after Alertmanager came back", func(a models.PostableAlert, firing bool) bool {
		return a.Labels["queue"] == "orders" && firing
	})
	redisErrs := testutil.ToFloat64(a.errors.WithLabelValues("redis"))
	amErrs := testutil.ToFloat64(a.errors.WithLabelValues("alertmanager"))
	if redisErrs < 1 || amErrs < 1 {
		t.Errorf("errors not counted: redis %v, alertmanager %v", redisErrs, amErrs)
	}
}

func TestNewAlerterErrors(t *testing.T) {
	rdb := redistest.Start(t).Client()
	c := newTestCollector(t, rdb, exporter.QueueFor("orders"))
	for _, tc := range []struct {
		url  string
		opts []Option
	}{
		{"localhost:9093", nil},
		{"ftp://am:9093", nil},
		{"http://am:9093", []Option{WithInterval(0)}},
		{"http://am:9093", []Option{WithResolveAfter(-time.Second)}},
	} {
		if _, err := New(c, tc.url, tc.opts...); err == nil {
			t.Errorf("New(%q) accepted", tc.url)
		}
	}
	if _, err := New(nil, "http://am:9093"); err == nil {
		t.Error("New(nil) accepted")
	}
}

// While Redis cannot be read, a firing page is not resolved: quiet that
// nobody could observe proves nothing.
func TestAlerterKeepsPagingWhileRedisIsDown(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, DialerRetries: 1, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	am := newFakeAM(t)
	a, _ := newTestAlerter(t, rdb, am.URL, WithResolveAfter(time.Millisecond))
	clock := time.Now()
	a.cfg.now = func() time.Time { return clock } // ticks run on this goroutine
	ctx := context.Background()
	a.tick(ctx) // baseline
	addDeadLetter(t, rdb, "orders")
	a.tick(ctx) // grows: fires
	srv.Stop()
	clock = clock.Add(100 * time.Millisecond) // past the resolve window, within the lease
	a.tick(ctx)
	a.tick(ctx)
	for _, al := range am.all() {
		if !time.Time(al.EndsAt).After(time.Time(al.StartsAt)) || !time.Time(al.EndsAt).After(clock) {
			t.Fatalf("the page was resolved while Redis was down: %+v", al)
		}
	}
	if len(am.all()) < 2 {
		t.Fatalf("the firing page was not re-posted while Redis was down: %d posts", len(am.all()))
	}
}

// The alerter posts JSON to <amURL>/api/v2/alerts, keeping the URL's path
// prefix (Alertmanager behind a proxy or with --web.route-prefix).
func TestAlerterPostsUnderPathPrefix(t *testing.T) {
	rdb := redistest.Start(t).Client()
	type request struct{ method, path, contentType string }
	got := make(chan request, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- request{r.Method, r.URL.Path, r.Header.Get("Content-Type")}
	}))
	t.Cleanup(srv.Close)
	a, logs := newTestAlerter(t, rdb, srv.URL+"/am/")
	ctx := context.Background()
	a.tick(ctx) // baseline
	addDeadLetter(t, rdb, "orders")
	a.tick(ctx) // the handler has run when the post returns
	select {
	case r := <-got:
		if want := (request{http.MethodPost, "/am/api/v2/alerts", "application/json"}); r != want {
			t.Errorf("request %+v, want %+v", r, want)
		}
	default:
		t.Fatalf("nothing posted; logs:\n%s", logs)
	}
}

// A reply that is not 2xx is an error naming the status and the start of
// the body, where Alertmanager says why it refused the alerts.
func TestAlerterPostRefused(t *testing.T) {
	rdb := redistest.Start(t).Client()
	long := strings.Repeat("x", 1000)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "maintenance window "+long, http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	a, _ := newTestAlerter(t, rdb, srv.URL)
	err := a.post(context.Background(), []postableAlert{a.alert("orders", &watch{startsAt: time.Now()}, time.Now())})
	if err == nil {
		t.Fatal("a 503 was taken for success")
	}
	msg := err.Error()
	if !strings.Contains(msg, "503") || !strings.Contains(msg, "maintenance window") || strings.Contains(msg, long) {
		t.Errorf("error %q: want the status and the start of the body only", msg)
	}
}

// A post gives up when its context ends, so a hung Alertmanager cannot
// stall the alerter past its shutdown.
func TestAlerterPostFollowsContext(t *testing.T) {
	rdb := redistest.Start(t).Client()
	started := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		// Read the body first: the server notices that the client went
		// away (and ends r's context) only after it.
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done() // hangs until the client goes away
	}))
	t.Cleanup(srv.Close)
	a, _ := newTestAlerter(t, rdb, srv.URL)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-started
		cancel()
	}()
	err := a.post(ctx, []postableAlert{a.alert("orders", &watch{startsAt: time.Now()}, time.Now())})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("post after its context was canceled: %v, want context.Canceled", err)
	}
}
