package idempotency_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/backstop-dev/backstop/idempotency"
	"github.com/backstop-dev/backstop/internal/testing/javatest"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
)

// A record stored by Go's Middleware is replayed by Java's servlet filter
// (sdk/java IdempotencyFilter in embedded Tomcat, dev.backstop.IdempotencyInterop),
// and one the Java filter stored is replayed by Go's Middleware: one record
// format, the header rule applied by both (Go's Location /orders/€42, which
// Tomcat would refuse raw; Java's Latin-1 /charges/café), neither handler run
// a second time, and the same key with another body is a conflict across
// languages too.
func TestJavaFilterAndGoMiddlewareShareRecords(t *testing.T) {
	srv := redistest.Start(t)
	store := idempotency.New(srv.Client(), idempotency.WithMetrics(idempotency.NewMetrics()))
	var goRuns atomic.Int64
	gosrv := httptest.NewServer(idempotency.Middleware(store)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		goRuns.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/orders/€42")
		w.WriteHeader(201)
		w.Write([]byte(`{"charged":"by go"}`))
	})))
	t.Cleanup(gosrv.Close)
	post := func(key, body string) (*http.Response, string) {
		s := &server{t: t, url: gosrv.URL}
		return s.post(key, body)
	}
	if resp, _ := post("from-go", "10"); resp.StatusCode != 201 {
		t.Fatalf("go first run: %d", resp.StatusCode)
	}

	cmd := javatest.Command(t, "IdempotencyInterop", srv.Addr, "from-go", "from-java")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the Java replayer: %v\n%s", err, stderr.String())
	}
	type result struct {
		Status      int    `json:"status"`
		Body        string `json:"body"`
		Location    string `json:"location"`
		ContentType string `json:"content_type"`
		Replayed    string `json:"replayed"`
	}
	var java struct {
		FromGo   result `json:"from-go"`
		FromJava result `json:"from-java"`
		Runs     int    `json:"runs"`
	}
	if err := json.Unmarshal(out, &java); err != nil {
		t.Fatalf("the Java replayer's output %q: %v", out, err)
	}
	want := result{Status: 201, Body: `{"charged":"by go"}`, Location: "/orders/%E2%82%AC42", ContentType: "application/json", Replayed: "true"}
	if java.FromGo != want {
		t.Errorf("Java replaying Go's record:\n got  %+v\n want %+v", java.FromGo, want)
	}
	if java.FromJava.Status != 201 || java.FromJava.Replayed != "" || java.Runs != 1 {
		t.Errorf("Java's own first run: %+v, %d handler runs (want 1: Go's record replayed, its own run)", java.FromJava, java.Runs)
	}

	resp, body := post("from-java", "10")
	if resp.StatusCode != 201 || body != "charged by java" || resp.Header.Get(idempotency.ReplayedHeader) != "true" ||
		resp.Header.Get("Location") != "/charges/caf%C3%A9" || resp.Header.Get("Content-Type") != java.FromJava.ContentType {
		t.Errorf("Go replaying Java's record: %d %q %v (Java answered %+v)", resp.StatusCode, body, resp.Header, java.FromJava)
	}
	if resp, _ := post("from-java", "11"); resp.StatusCode != http.StatusUnprocessableEntity {
		t.Errorf("another body under Java's key: %d, want 422", resp.StatusCode)
	}
	if n := goRuns.Load(); n != 1 {
		t.Errorf("the Go handler ran %d times, want 1", n)
	}
}
