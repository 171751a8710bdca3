package e2e

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/retry"
)

// servicePolicy opens its breaker after three timeouts in a row and keeps
// it open past any test; no backoff delay, so the calls take no time.
const servicePolicy = "name: payments\nmax_attempts: 3\nbackoff: {strategy: none}\n" +
	"circuit_breaker: {failure_threshold: 3, open_for: 1h}\n"

// startService plays a service that calls a dependency through retry.Do
// with metrics: one call retried then successful, one that fails on every
// attempt and opens the breaker, and one the open breaker refuses. It
// serves its registry on /metrics, as a service does, and returns the
// address and a function that makes one more call, which the breaker
// refuses.
func startService(t *testing.T) (addr string, refuse func()) {
	t.Helper()
	p, err := policy.Parse([]byte(servicePolicy))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	ctx := context.Background()
	timeout := &backstop.Failure{ErrorKind: "timeout"}
	call := func(outcomes ...error) error {
		n := 0
		_, err := retry.Do(ctx, backstop.Native(p), func(context.Context) (int, error) {
			n++
			if n > len(outcomes) {
				t.Fatalf("attempt %d made, %d scripted", n, len(outcomes))
			}
			return n, outcomes[n-1]
		}, retry.WithMetrics(reg, "payments", "charge-api"))
		return err
	}
	var re *retry.Error
	if err := call(timeout, nil); err != nil {
		t.Fatal(err)
	}
	if err := call(timeout, timeout, timeout); !errors.As(err, &re) || re.Reason != policy.MaxAttemptsReached {
		t.Fatalf("failing call: %v, want max_attempts_reached", err)
	}
	refuse = func() {
		var re *retry.Error
		if err := call(); !errors.As(err, &re) || re.Reason != policy.CircuitOpen {
			t.Errorf("call while open: %v, want circuit_open", err)
		}
	}
	refuse()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	s := &http.Server{Handler: mux}
	go s.Serve(l)
	t.Cleanup(func() { s.Close() })
	return l.Addr().String(), refuse
}

// TestInProcessAlertFires: a service's refused calls reach the pager path
// through the real Prometheus (scraping the service with the generated
// rules) and the real Alertmanager.
func TestInProcessAlertFires(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: runs in make test, not with -short")
	}
	dir := t.TempDir()
	hooks := newReceiver(t)
	service, refuse := startService(t)
	amAddr := startAlertmanager(t, dir, hooks.addr)
	// No exporter: in-process alerts need none.
	startPrometheus(t, dir, freeAddr(t), amAddr, service)
	// Refusals go on while Prometheus scrapes: a counter's growth fires,
	// not its level at the first scrape.
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			case <-time.After(200 * time.Millisecond):
			}
			refuse()
		}
	}()
	defer func() { close(done); wg.Wait() }()
	a := hooks.wait(t, 120*time.Second, "/ticket", "firing", "BackstopClientCallsRefused")
	want := map[string]string{"policy": "payments", "target": "charge-api", "reason": "circuit_open", "severity": "warning"}
	for k, v := range want {
		if a.Labels[k] != v {
			t.Errorf("label %s = %q, want %q (%+v)", k, a.Labels[k], v, a.Labels)
		}
	}
	if a.Annotations["runbook_url"] == "" || a.Annotations["description"] == "" {
		t.Errorf("annotations: %+v", a.Annotations)
	}
}
