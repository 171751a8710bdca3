package docs_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/retry"
)

// The README's retry loop, as written.
func TestReadmeRetry(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") }))
	defer srv.Close()
	ctx := context.Background()
	req, _ := http.NewRequest(http.MethodPost, srv.URL, nil)
	req.Header.Set("Idempotency-Key", "order-17")

	p, err := policy.Preset("critical")
	resp, err := retry.Do(ctx, backstop.Native(p), func(ctx context.Context) (*http.Response, error) {
		return http.DefaultClient.Do(req.WithContext(ctx))
	}, retry.WithRequest(req), retry.WithMetrics(prometheus.DefaultRegisterer, "critical", "charge-api"))

	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("Do = %v, %v", resp, err)
	}
	resp.Body.Close()
	if n, err := testutil.GatherAndCount(prometheus.DefaultGatherer, "backstop_client_attempts_total"); err != nil || n == 0 {
		t.Fatalf("no backstop_client_attempts_total in the default registry (%d, %v)", n, err)
	}
}

// The README's retry at one layer, as written: a service whose loop to
// the ledger gave up tells its caller so, and the caller does not retry.
func TestReadmeLayers(t *testing.T) {
	ledgerCalls := 0
	ledgerSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ledgerCalls++
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer ledgerSrv.Close()
	lp, err := policy.Parse([]byte("max_attempts: 3\nbackoff: {strategy: constant, base: 1ms}\njitter: {mode: none}\n"))
	if err != nil {
		t.Fatal(err)
	}
	ledger := backstop.Native(lp)
	charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, _ := http.NewRequestWithContext(r.Context(), http.MethodGet, ledgerSrv.URL, nil)
		resp, err := retry.Do(r.Context(), ledger, func(context.Context) (*http.Response, error) {
			return http.DefaultClient.Do(req)
		}, retry.WithRequest(req))
		if resp != nil {
			resp.Body.Close()
		}
		if err != nil {
			http.Error(w, "ledger unavailable", http.StatusServiceUnavailable)
		}
	})
	mux := http.NewServeMux()

	mux.Handle("/charge", retry.Middleware(charge, ledger)) // ledger: the policy charge calls the ledger with

	srv := httptest.NewServer(mux)
	defer srv.Close()
	p, _ := policy.Preset("critical")
	calls := 0
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/charge", nil)
	_, err = retry.Do(context.Background(), backstop.Native(p), func(context.Context) (*http.Response, error) {
		calls++
		return http.DefaultClient.Do(req)
	}, retry.WithRequest(req))
	var re *retry.Error
	if !errors.As(err, &re) || re.Reason != policy.RetriedDownstream || calls != 1 || ledgerCalls != 3 {
		t.Fatalf("Do = %v after %d calls (%d to the ledger); want retried_downstream after 1 (3)", err, calls, ledgerCalls)
	}
}
