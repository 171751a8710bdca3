package retry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/host"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/retry"
)

var t0 = time.UnixMilli(1767225600000)

func parse(t *testing.T, text string) backstop.Decider {
	t.Helper()
	p, err := policy.Parse([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return backstop.Native(p)
}

const constant = "max_attempts: 4\nbackoff: {strategy: constant, base: 100ms}\njitter: {mode: none}\n"

// calls returns an operation that returns errs in turn, then nil, and
// counts its calls.
func calls(n *int, errs ...error) retry.Operation[string] {
	return func(context.Context) (string, error) {
		*n++
		if *n <= len(errs) {
			return "", errs[*n-1]
		}
		return "done", nil
	}
}

func TestRetriesUntilSuccess(t *testing.T) {
	clk := &retry.FakeClock{T: t0}
	n := 0
	refused := &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}
	v, err := retry.Do(context.Background(), parse(t, constant),
		calls(&n, refused, context.DeadlineExceeded), retry.WithClock(clk))
	if err != nil || v != "done" || n != 3 {
		t.Fatalf("Do = %q, %v after %d calls; want done, nil after 3", v, err, n)
	}
	if want := []time.Duration{100 * time.Millisecond, 100 * time.Millisecond}; fmt.Sprint(clk.Sleeps) != fmt.Sprint(want) {
		t.Fatalf("slept %v, want %v", clk.Sleeps, want)
	}
}

func TestStopsWithReasonAndLastError(t *testing.T) {
	last := &backstop.Failure{ErrorKind: "timeout", Err: errors.New("fourth")}
	tests := []struct {
		name     string
		errs     []error
		reason   policy.Reason
		attempts int64
		last     error
	}{
		{"max attempts", []error{context.DeadlineExceeded, context.DeadlineExceeded, context.DeadlineExceeded, last}, policy.MaxAttemptsReached, 4, last},
		{"permanent kind", []error{&backstop.Failure{ErrorKind: "invalid_input"}}, policy.PermanentError, 1, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := 0
			_, err := retry.Do(context.Background(), parse(t, constant), calls(&n, tc.errs...), retry.WithClock(&retry.FakeClock{T: t0}))
			var re *retry.Error
			if !errors.As(err, &re) {
				t.Fatalf("Do = %v, want a *retry.Error", err)
			}
			if re.Reason != tc.reason || re.Attempts != tc.attempts || int64(n) != tc.attempts {
				t.Fatalf("stopped with %s after %d attempts (%d calls), want %s after %d", re.Reason, re.Attempts, n, tc.reason, tc.attempts)
			}
			if !errors.Is(err, tc.errs[len(tc.errs)-1]) {
				t.Fatalf("errors.Is(%v, last error) = false", err)
			}
		})
	}
}

type roundTrip struct {
	status      []int
	retryAfter  string
	n           int
	bodiesClose int
}

func (rt *roundTrip) do(req *http.Request) retry.Operation[*http.Response] {
	return func(ctx context.Context) (*http.Response, error) {
		s := rt.status[min(rt.n, len(rt.status)-1)]
		rt.n++
		h := http.Header{}
		if rt.retryAfter != "" {
			h.Set("Retry-After", rt.retryAfter)
		}
		return &http.Response{StatusCode: s, Header: h, Request: req, Body: &body{rt: rt}}, nil
	}
}

type body struct{ rt *roundTrip }

func (b *body) Read([]byte) (int, error) { return 0, io.EOF }
func (b *body) Close() error             { b.rt.bodiesClose++; return nil }

func TestHTTPResponses(t *testing.T) {
	get, _ := http.NewRequest(http.MethodGet, "http://example.test/", nil)
	post, _ := http.NewRequest(http.MethodPost, "http://example.test/", nil)
	keyed, _ := http.NewRequest(http.MethodPost, "http://example.test/", nil)
	keyed.Header.Set("Idempotency-Key", "order-17")
	tests := []struct {
		name       string
		req        *http.Request
		status     []int
		retryAfter string
		calls      int
		reason     string // "" for success
		sleeps     string
	}{
		{"503 then 200", get, []int{503, 200}, "", 2, "", "[100ms]"},
		{"Retry-After is a floor", get, []int{429, 200}, "7", 2, "", "[7s]"},
		{"404 is permanent", get, []int{404}, "", 1, "permanent_error", "[]"},
		{"POST without a key", post, []int{503}, "", 1, "not_idempotent", "[]"},
		{"POST with Idempotency-Key", keyed, []int{503, 200}, "", 2, "", "[100ms]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rt := &roundTrip{status: tc.status, retryAfter: tc.retryAfter}
			clk := &retry.FakeClock{T: t0}
			resp, err := retry.Do(context.Background(), parse(t, constant), rt.do(tc.req), retry.WithClock(clk))
			if rt.n != tc.calls || fmt.Sprint(clk.Sleeps) != tc.sleeps {
				t.Fatalf("%d calls, slept %v; want %d, %s", rt.n, clk.Sleeps, tc.calls, tc.sleeps)
			}
			if rt.bodiesClose != tc.calls-1 {
				t.Fatalf("%d bodies closed, want %d (every retried response's)", rt.bodiesClose, tc.calls-1)
			}
			if tc.reason == "" {
				if err != nil || resp.StatusCode != 200 {
					t.Fatalf("Do = %v, %v; want 200, nil", resp, err)
				}
				return
			}
			var re *retry.Error
			var se *retry.StatusError
			if !errors.As(err, &re) || re.Reason.String() != tc.reason || !errors.As(err, &se) || se.StatusCode != tc.status[0] {
				t.Fatalf("Do error = %v, want %s with status %d", err, tc.reason, tc.status[0])
			}
			if resp == nil || resp.StatusCode != tc.status[0] {
				t.Fatalf("Do returned %v, want the last response", resp)
			}
		})
	}
}

// A failure without a response takes the method and key from WithRequest.
func TestWithRequestGatesRetries(t *testing.T) {
	post, _ := http.NewRequest(http.MethodPost, "http://example.test/", nil)
	n := 0
	_, err := retry.Do(context.Background(), parse(t, constant), calls(&n, context.DeadlineExceeded),
		retry.WithClock(&retry.FakeClock{T: t0}), retry.WithRequest(post))
	var re *retry.Error
	if !errors.As(err, &re) || re.Reason != policy.NotIdempotent || n != 1 {
		t.Fatalf("Do = %v after %d calls, want not_idempotent after 1", err, n)
	}
}

var timeout = &backstop.Failure{ErrorKind: "timeout", Err: io.ErrUnexpectedEOF}

func TestContextDeadlineIsAnElapsedLimit(t *testing.T) {
	now := time.Now()
	ctx, cancel := context.WithDeadline(context.Background(), now.Add(250*time.Millisecond))
	defer cancel()
	clk := &retry.FakeClock{T: now}
	n := 0
	_, err := retry.Do(ctx, parse(t, constant), calls(&n, timeout, timeout, timeout), retry.WithClock(clk))
	var re *retry.Error
	// Retries at +100ms and +200ms fit; one due at +300ms would not.
	if !errors.As(err, &re) || re.Reason != policy.MaxElapsedExceeded || n != 3 || len(clk.Sleeps) != 2 {
		t.Fatalf("Do = %v after %d calls and %d sleeps, want max_elapsed_exceeded after 3 calls and 2 sleeps", err, n, len(clk.Sleeps))
	}
	if !errors.Is(err, timeout) {
		t.Fatalf("the last error is lost: %v", err)
	}
}

func TestCancelDuringSleep(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	clk := &retry.FakeClock{T: t0, OnSleep: cancel}
	n := 0
	_, err := retry.Do(ctx, parse(t, constant), calls(&n, io.ErrUnexpectedEOF), retry.WithClock(clk))
	if !errors.Is(err, context.Canceled) || !errors.Is(err, io.ErrUnexpectedEOF) || n != 1 {
		t.Fatalf("Do = %v after %d calls, want context.Canceled and the last error after 1", err, n)
	}
}

const breaker = "max_attempts: 2\nbackoff: {strategy: constant, base: 100ms}\njitter: {mode: none}\n" +
	"circuit_breaker: {failure_threshold: 2, open_for: 10s, half_open_max_calls: 1}\n"

// *host.Policy (the policy in backstop.wasm) is a backstop.Decider as it is.
var _ backstop.Decider = (*host.Policy)(nil)

func TestBreakerRefusesBeforeTheCall(t *testing.T) {
	rt, err := host.New(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(context.Background()) })
	hp, err := rt.Load(context.Background(), []byte(breaker))
	if err != nil {
		t.Fatal(err)
	}
	for name, p := range map[string]backstop.Decider{"native": parse(t, breaker), "wasm": hp} {
		t.Run(name, func(t *testing.T) { breakerRefuses(t, p) })
	}
}

func breakerRefuses(t *testing.T, p backstop.Decider) {
	clk := &retry.FakeClock{T: t0}
	n := 0
	// Two timeouts in a row open the breaker.
	_, err := retry.Do(context.Background(), p, calls(&n, context.DeadlineExceeded, context.DeadlineExceeded), retry.WithClock(clk))
	var re *retry.Error
	if !errors.As(err, &re) || re.Reason != policy.MaxAttemptsReached {
		t.Fatalf("first Do = %v, want max_attempts_reached", err)
	}
	n = 0
	_, err = retry.Do(context.Background(), p, calls(&n), retry.WithClock(clk))
	if !errors.As(err, &re) || re.Reason != policy.CircuitOpen || n != 0 || re.Attempts != 0 {
		t.Fatalf("Do while open = %v after %d calls, want circuit_open before any call", err, n)
	}
	// The second failure, at t0+100ms, opened it; the refusal comes at once.
	if want := 10 * time.Second; re.RetryIn != want {
		t.Fatalf("RetryIn = %v, want %v (until the breaker half-opens)", re.RetryIn, want)
	}
	if re.Err != nil || errors.Unwrap(err) != nil {
		t.Fatalf("a refusal carries no call's error: %v", re.Err)
	}
	// Half-open: the trial succeeds and closes the breaker.
	clk.T = clk.T.Add(re.RetryIn)
	v, err := retry.Do(context.Background(), p, calls(&n), retry.WithClock(clk))
	if err != nil || v != "done" || n != 1 {
		t.Fatalf("Do half-open = %q, %v after %d calls, want the trial to go through", v, err, n)
	}
	if s, _ := p.CircuitState(context.Background(), clk.T.UnixMilli()); s != policy.BreakerClosed {
		t.Fatalf("breaker %s after a successful trial, want closed", s)
	}
}

func TestNilPolicy(t *testing.T) {
	_, err := retry.Do(context.Background(), nil, func(context.Context) (int, error) { return 0, nil })
	if err == nil || !strings.Contains(err.Error(), "policy") {
		t.Fatalf("Do(nil policy) = %v, want an error naming the policy", err)
	}
}

// Issue 43: a dependency that answers every call, slowly. The loop
// measures each call and reports its duration, so a slow-call rate opens
// the breaker on successes alone (the 10th call: minimum_calls), natively
// and through backstop.wasm.
func TestSlowSuccessesOpenTheBreaker(t *testing.T) {
	const slow = "circuit_breaker: {type: failure_rate, slow_call_rate_threshold: 50, slow_call_duration_threshold: 2s,\n" +
		"  sliding_window: {type: count, size: 20}, minimum_calls: 10, open_for: 30s}\n"
	rt, err := host.New(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(context.Background()) })
	hp, err := rt.Load(context.Background(), []byte(slow))
	if err != nil {
		t.Fatal(err)
	}
	for name, p := range map[string]backstop.Decider{"native": parse(t, slow), "wasm": hp} {
		t.Run(name, func(t *testing.T) {
			clk := &retry.FakeClock{T: t0}
			for i := 0; i < 10; i++ {
				took := 3 * time.Second // four slow calls of every five
				if i%5 == 4 {
					took = 100 * time.Millisecond
				}
				op := func(context.Context) (string, error) { clk.T = clk.T.Add(took); return "ok", nil }
				if _, err := retry.Do(context.Background(), p, op, retry.WithClock(clk)); err != nil {
					t.Fatalf("call %d: %v", i, err)
				}
			}
			n := 0
			_, err := retry.Do(context.Background(), p, calls(&n), retry.WithClock(clk))
			var re *retry.Error
			if !errors.As(err, &re) || re.Reason != policy.CircuitOpen || n != 0 {
				t.Fatalf("after 8 slow successes of 10: %v after %d calls, want circuit_open before any call", err, n)
			}
		})
	}
}
