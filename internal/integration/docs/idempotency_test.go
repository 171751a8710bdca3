package docs_test

// The Go block of docs/idempotency.md, "Go", run as written
// (TestDocsEveryBlockIsRun checks that it appears here).

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/backstop-dev/backstop/idempotency"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
)

func TestIdempotencyDocGo(t *testing.T) {
	rdb := redistest.Start(t).Client()
	charges := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(201) })

	store := idempotency.New(rdb, idempotency.WithLease(30*time.Second), idempotency.WithRetention(24*time.Hour))
	mux := http.NewServeMux()
	mux.Handle("POST /charges", idempotency.Middleware(store)(charges))

	srv := httptest.NewServer(mux)
	defer srv.Close()
	var got []string
	for range 2 {
		req, _ := http.NewRequest("POST", srv.URL+"/charges", strings.NewReader(`{"amount": 10}`))
		req.Header.Set("Idempotency-Key", "order-42")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		got = append(got, resp.Status+" replayed="+resp.Header.Get(idempotency.ReplayedHeader))
	}
	if want := "201 Created replayed=,201 Created replayed=true"; strings.Join(got, ",") != want {
		t.Fatalf("got %v, want %s", got, want)
	}
}
