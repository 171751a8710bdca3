//go:build unix

package retry_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/host"
	"github.com/backstop-dev/backstop/internal/testing/blackhole"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/retry"
)

// connectTimeout's connect_timeout ends a connect long before the
// attempt's own deadline: the failure is connect_timeout, not timeout.
const connectTimeout = "max_attempts: 2\nattempt_timeout: 30s\nconnect_timeout: 100ms\nbackoff: {strategy: constant, base: 1ms}\njitter: {mode: none}\n"

// A connect to a peer that never answers fails after connect_timeout with
// the error kind connect_timeout, in the native and the wasm policy, and
// the policy retries it (never sent, so retryable even for a POST).
func TestConnectTimeout(t *testing.T) {
	addr := blackhole.Addr(t)
	rt, err := host.New(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(context.Background()) })
	hp, err := rt.Load(context.Background(), []byte(connectTimeout))
	if err != nil {
		t.Fatal(err)
	}
	for name, p := range map[string]backstop.Decider{"native": parse(t, connectTimeout), "wasm": hp} {
		t.Run(name, func(t *testing.T) {
			if got := p.ConnectTimeoutMs(); got != 100 {
				t.Fatalf("ConnectTimeoutMs() = %d, want 100", got)
			}
			client := &http.Client{Transport: retry.Transport(retry.HTTPTransport(p))}
			attempts := 0
			_, err := retry.Do(context.Background(), p, func(ctx context.Context) (*http.Response, error) {
				attempts++
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/charge", nil)
				if err != nil {
					return nil, err
				}
				return client.Do(req)
			}, retry.WithClock(&retry.FakeClock{T: t0}))
			var re *retry.Error
			if !errors.As(err, &re) || re.Reason != policy.MaxAttemptsReached || attempts != 2 {
				t.Fatalf("Do = %v after %d attempts, want max_attempts_reached after 2 (a POST that never connected is retried)", err, attempts)
			}
			var f policy.Failure
			backstop.ClassifyError(re.Err, &f)
			if f.ErrorKind != "connect_timeout" {
				t.Errorf("last error %v: kind %q, want connect_timeout", re.Err, f.ErrorKind)
			}
		})
	}
}

// Without connect_timeout the dialer keeps net/http's own dialer timeout
// (http.DefaultTransport's 30 s): HTTPTransport must not drop that bound
// (a zero Timeout waits for the kernel's SYN retries, about 2 minutes).
func TestConnectTimeoutNone(t *testing.T) {
	p := parse(t, "max_attempts: 2\n")
	if d := retry.Dialer(p); d.Timeout != 30*time.Second {
		t.Errorf("Dialer().Timeout = %v, want http.DefaultTransport's 30s", d.Timeout)
	}
	if tr := retry.HTTPTransport(p); tr.DialContext == nil || tr.TLSHandshakeTimeout == 0 {
		t.Errorf("HTTPTransport is not a clone of http.DefaultTransport")
	}
}

// A program that wrapped http.DefaultTransport (tracing, metrics) still
// gets a transport with net/http's defaults, not a panic.
func TestHTTPTransportDefaultWrapped(t *testing.T) {
	orig := http.DefaultTransport
	t.Cleanup(func() { http.DefaultTransport = orig })
	http.DefaultTransport = wrapped{orig}
	tr := retry.HTTPTransport(parse(t, connectTimeout))
	if tr.DialContext == nil || tr.TLSHandshakeTimeout == 0 || tr.Proxy == nil || tr.MaxIdleConns == 0 {
		t.Errorf("HTTPTransport over a wrapped DefaultTransport lacks net/http's defaults: %+v", tr)
	}
}

type wrapped struct{ http.RoundTripper }
