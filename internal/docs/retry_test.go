package docs_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

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
	resp, err := retry.Do(ctx, retry.Native(p), func(ctx context.Context) (*http.Response, error) {
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
