package retry_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"
	"time"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/internal/errkind"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/retry"
)

const threeFast = "max_attempts: 3\nbackoff: {strategy: constant, base: 1ms}\njitter: {mode: none}\n"

// recorder answers 503 and records the attempt headers of each request.
func recorder(t *testing.T) (*httptest.Server, *[][2]string) {
	var seen [][2]string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = append(seen, [2]string{r.Header.Get(retry.HeaderAttempt), r.Header.Get(retry.HeaderEnvoyAttempt)})
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	return srv, &seen
}

func TestAttemptHeadersPerAttempt(t *testing.T) {
	for _, tc := range []struct {
		name   string
		preset http.Header
		opts   []retry.Option
		want   [][2]string
	}{
		{"set on each attempt", nil, nil, [][2]string{{"1", "1"}, {"2", "2"}, {"3", "3"}}},
		{"the caller's own kept", http.Header{"Backstop-Attempt": {"7"}}, nil, [][2]string{{"7", "1"}, {"7", "2"}, {"7", "3"}}},
		{"turned off", nil, []retry.Option{retry.WithoutAttemptHeaders()}, [][2]string{{"", ""}, {"", ""}, {"", ""}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, seen := recorder(t)
			req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
			for k, v := range tc.preset {
				req.Header[k] = v
			}
			resp, err := retry.Do(context.Background(), parse(t, threeFast), func(context.Context) (*http.Response, error) {
				return http.DefaultClient.Do(req)
			}, append([]retry.Option{retry.WithRequest(req)}, tc.opts...)...)
			drain(resp)
			if !reflect.DeepEqual(*seen, tc.want) {
				t.Fatalf("attempt headers %v, want %v (err %v)", *seen, tc.want, err)
			}
			// Gone once Do returns, the caller's own kept: the request
			// can be sent again by another loop, from attempt 1.
			if got := req.Header.Get(retry.HeaderEnvoyAttempt); got != "" || req.Header.Get(retry.HeaderAttempt) != tc.preset.Get(retry.HeaderAttempt) {
				t.Fatalf("after Do: %v, want only the caller's headers %v", req.Header, tc.preset)
			}
		})
	}
}

func TestTransportSetsTheContextsAttempt(t *testing.T) {
	srv, seen := recorder(t)
	client := &http.Client{Transport: retry.Transport(nil)}
	resp, _ := retry.Do(context.Background(), parse(t, threeFast), func(ctx context.Context) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
		return client.Do(req)
	})
	drain(resp)
	resp, err := client.Get(srv.URL) // outside Do: no attempt to send
	if err != nil {
		t.Fatal(err)
	}
	drain(resp)
	want := [][2]string{{"1", "1"}, {"2", "2"}, {"3", "3"}, {"", ""}}
	if !reflect.DeepEqual(*seen, want) {
		t.Fatalf("attempt headers %v, want %v", *seen, want)
	}
}

func TestAttemptMetadata(t *testing.T) {
	var got [][]string
	n := 0
	retry.Do(context.Background(), parse(t, threeFast), func(ctx context.Context) (int, error) {
		got = append(got, retry.AttemptMetadata(ctx))
		n++
		return 0, &backstop.Failure{ErrorKind: "timeout", Err: errors.New("slow")}
	})
	want := [][]string{{"backstop-attempt", "1"}, {"backstop-attempt", "2", "grpc-previous-rpc-attempts", "1"},
		{"backstop-attempt", "3", "grpc-previous-rpc-attempts", "2"}}
	if !reflect.DeepEqual(got, want) || retry.AttemptMetadata(context.Background()) != nil || retry.Attempt(context.Background()) != 0 {
		t.Fatalf("metadata %v, want %v, and none outside Do", got, want)
	}
}

// serve runs one request through Middleware(h, ps...) and returns the
// response and whether h ran.
func serve(h http.HandlerFunc, ps ...backstop.Decider) (*httptest.ResponseRecorder, bool) {
	ran := false
	w := httptest.NewRecorder()
	retry.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran = true
		h(w, r)
	}), ps...).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
	return w, ran
}

func TestMiddlewareShedsWhileTheBreakerIsOpen(t *testing.T) {
	np, err := policy.Parse([]byte(threeFast + "circuit_breaker: {failure_threshold: 1, open_for: 1h}\n"))
	if err != nil {
		t.Fatal(err)
	}
	p := backstop.Native(np)
	ok := func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }
	if w, ran := serve(ok, p); !ran || w.Code != 200 || w.Header().Get(retry.HeaderNoRetry) != "" {
		t.Fatalf("closed breaker: %d %v, ran %v; want the handler's 200, unmarked", w.Code, w.Header(), ran)
	}
	np.Decide(policy.Failure{Attempt: 1, HTTPStatus: 503, NowMs: time.Now().UnixMilli()})
	w, ran := serve(ok, nil, p)
	if ran || w.Code != 503 || w.Header().Get(retry.HeaderNoRetry) != "circuit_open" || w.Header().Get(retry.HeaderOverloaded) != "true" {
		t.Fatalf("open breaker: %d %v, ran %v; want 503 with both headers, the handler not run", w.Code, w.Header(), ran)
	}
}

func TestMiddlewareMarksAFailureALoopGaveUp(t *testing.T) {
	p := parse(t, threeFast)
	loop := func(code int, errs ...error) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			n := 0
			if _, err := retry.Do(r.Context(), p, calls(&n, errs...)); err != nil && code == 0 {
				code = 502
			}
			if code == 0 {
				code = 200
			}
			w.WriteHeader(code)
		}
	}
	slow := &backstop.Failure{ErrorKind: "timeout", Err: errors.New("slow")}
	bad := &backstop.Failure{ErrorKind: "invalid_input", Err: errors.New("bad")}
	for _, tc := range []struct {
		name string
		h    http.HandlerFunc
		want string
	}{
		{"gave up", loop(0, slow, slow, slow), "max_attempts_reached"},
		{"permanent", loop(0, bad), "permanent_error"},
		{"recovered", loop(0, slow), ""},
		{"gave up, answered 200", loop(200, slow, slow, slow), ""},
		{"no loop", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(500) }, ""},
		{"the handler's own header", func(w http.ResponseWriter, r *http.Request) {
			loop(0, bad)(httptest.NewRecorder(), r)
			w.Header().Set(retry.HeaderNoRetry, "mine")
			w.WriteHeader(503)
		}, "mine"},
		{"written by Write", func(w http.ResponseWriter, r *http.Request) {
			loop(0, slow, slow, slow)(httptest.NewRecorder(), r)
			fmt.Fprint(w, "fine")
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, _ := serve(tc.h)
			if got := w.Header().Get(retry.HeaderNoRetry); got != tc.want {
				t.Fatalf("%s = %q (status %d), want %q", retry.HeaderNoRetry, got, w.Code, tc.want)
			}
		})
	}
}

// A queue worker classifies the *Error of a Do inside its handler as Do
// classified the last attempt, marked as given up below, except a
// breaker's refusal.
func TestClassifyAnInnerLoopsError(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want policy.Failure
	}{
		{"a failed response", &retry.Error{Reason: policy.MaxAttemptsReached, Attempts: 3,
			Err: &retry.StatusError{StatusCode: 503, RetryAfter: "7"}}, policy.Failure{HTTPStatus: 503, RetryAfter: "7", RetriedDownstream: true}},
		{"an overloaded server", &retry.Error{Reason: policy.ServerDeclined, Attempts: 1,
			Err: &retry.StatusError{StatusCode: 503, ServerDeclined: true}}, policy.Failure{HTTPStatus: 503, RetriedDownstream: true, ServerDeclined: true}},
		{"wrapped", fmt.Errorf("charge: %w", &retry.Error{Reason: policy.MaxAttemptsReached, Attempts: 3,
			Err: &backstop.Failure{ErrorKind: "timeout"}}), policy.Failure{ErrorKind: "timeout", RetriedDownstream: true}},
		{"a breaker's refusal", &retry.Error{Reason: policy.CircuitOpen}, policy.Failure{}},
		{"a plain failed response", &retry.StatusError{StatusCode: 502}, policy.Failure{HTTPStatus: 502}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f policy.Failure
			errkind.Classify(tc.err, &f)
			if f != tc.want {
				t.Fatalf("Classify = %+v, want %+v", f, tc.want)
			}
		})
	}
}
