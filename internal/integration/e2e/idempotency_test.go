package e2e

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/idempotency"
)

// startIdempotentService plays a service that mounts the idempotency
// middleware over a real Redis: one keyed POST runs, its retry is replayed.
// It serves its registry on /metrics and returns the address.
func startIdempotentService(t *testing.T, rdb *redis.Client) string {
	t.Helper()
	reg := prometheus.NewRegistry()
	m := idempotency.NewMetrics()
	reg.MustRegister(m)
	store := idempotency.New(rdb, idempotency.WithMetrics(m))
	charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"charge":"ch_1"}`)
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/charges", idempotency.Middleware(store)(charge))
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	s := &http.Server{Handler: mux}
	go s.Serve(l)
	t.Cleanup(func() { s.Close() })
	addr := l.Addr().String()
	for i, want := range []string{"", "true"} { // first run, then the replay
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/charges", strings.NewReader(`{"amount":100}`))
		req.Header.Set("Idempotency-Key", "order-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := resp.Header.Get(idempotency.ReplayedHeader); resp.StatusCode != http.StatusCreated || got != want {
			t.Fatalf("POST %d: %d, %s %q, want 201 and %q", i+1, resp.StatusCode, idempotency.ReplayedHeader, got, want)
		}
	}
	return addr
}
