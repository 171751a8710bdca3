package retry_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/retry"
)

// A policy with no backoff delay keeps the examples instant; a real one
// would use a preset such as policy.Preset("critical").
const instant = "max_attempts: 3\nbackoff: {strategy: none}\n"

// An HTTP call retried through two 503s.
func ExampleDo() {
	failures := 2
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if failures > 0 {
			failures--
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, "ok")
	}))
	defer srv.Close()

	p, err := policy.Parse([]byte(instant))
	if err != nil {
		panic(err)
	}
	req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
	resp, err := retry.Do(context.Background(), backstop.Native(p), func(ctx context.Context) (*http.Response, error) {
		return http.DefaultClient.Do(req.WithContext(ctx))
	}, retry.WithRequest(req))
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	fmt.Println(resp.StatusCode)
	// Output: 200
}

// When retrying stops, the error says why and keeps the last error.
func ExampleError() {
	p, _ := policy.Parse([]byte(instant))
	errDown := errors.New("connection reset by peer")
	_, err := retry.Do(context.Background(), backstop.Native(p), func(context.Context) (struct{}, error) {
		return struct{}{}, fmt.Errorf("charge: %w", context.DeadlineExceeded)
	})
	var re *retry.Error
	if errors.As(err, &re) {
		fmt.Println(re.Reason, re.Attempts, errors.Is(err, context.DeadlineExceeded), errors.Is(err, errDown))
	}
	// Output: max_attempts_reached 3 true false
}

// Count attempts, retries and breaker state in a Prometheus registry.
func ExampleWithMetrics() {
	reg := prometheus.NewRegistry()
	p, _ := policy.Parse([]byte(instant))
	tries := 0
	_, _ = retry.Do(context.Background(), backstop.Native(p), func(context.Context) (int, error) {
		if tries++; tries == 1 {
			return 0, context.DeadlineExceeded
		}
		return 42, nil
	}, retry.WithMetrics(reg, "payments", "charge-api"))
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "backstop_client_attempts_total" {
			for _, m := range mf.GetMetric() {
				fmt.Println(m.GetLabel()[0].GetValue(), m.GetCounter().GetValue())
			}
		}
	}
	// Output:
	// dead_letter 0
	// refused 0
	// retry 1
	// success 1
}
