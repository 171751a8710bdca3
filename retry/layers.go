package retry

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/policy"
)

// Retry at one layer (docs/layers.md): the headers a loop sends and the
// ones a server answers with.
const (
	// HeaderAttempt carries the attempt number (1 for the first call).
	HeaderAttempt = "Backstop-Attempt"
	// HeaderEnvoyAttempt is Envoy's name for it.
	HeaderEnvoyAttempt = "X-Envoy-Attempt-Count"
	// HeaderNoRetry on a response says a layer below has decided the
	// failure (its value is why it stopped): do not retry it.
	HeaderNoRetry = "Backstop-No-Retry"
	// HeaderOverloaded is Envoy's "do not retry": the server sheds load.
	HeaderOverloaded = "X-Envoy-Overloaded"
)

type attemptKey struct{}

// Attempt returns the attempt number Do runs the operation for (1 for the
// first call), 0 outside Do.
func Attempt(ctx context.Context) int64 {
	n, _ := ctx.Value(attemptKey{}).(int64)
	return n
}

// AttemptMetadata returns the gRPC metadata pairs of ctx's attempt, for
// metadata.AppendToOutgoingContext(ctx, retry.AttemptMetadata(ctx)...):
// backstop-attempt, and grpc-previous-rpc-attempts on a retry, as gRPC's
// own retries send it. None outside Do.
func AttemptMetadata(ctx context.Context) []string {
	n := Attempt(ctx)
	if n < 1 {
		return nil
	}
	md := []string{"backstop-attempt", strconv.FormatInt(n, 10)}
	if n > 1 {
		md = append(md, "grpc-previous-rpc-attempts", strconv.FormatInt(n-1, 10))
	}
	return md
}

// callerSet says which attempt headers h already has: Do and Transport
// leave those as the caller set them.
func callerSet(h http.Header) [2]bool {
	return [2]bool{h.Get(HeaderAttempt) != "", h.Get(HeaderEnvoyAttempt) != ""}
}

// setAttemptHeaders sets the attempt headers of attempt n on h, except
// those the caller set itself (kept lists the names to leave alone).
func setAttemptHeaders(h http.Header, n int64, kept [2]bool) {
	v := strconv.FormatInt(n, 10)
	if !kept[0] {
		h.Set(HeaderAttempt, v)
	}
	if !kept[1] {
		h.Set(HeaderEnvoyAttempt, v)
	}
}

// clearAttemptHeaders removes the attempt headers setAttemptHeaders set.
func clearAttemptHeaders(h http.Header, kept [2]bool) {
	if !kept[0] {
		h.Del(HeaderAttempt)
	}
	if !kept[1] {
		h.Del(HeaderEnvoyAttempt)
	}
}

// Transport returns a RoundTripper that sets the attempt headers of the
// request context's attempt (Attempt) on each request it sends, for
// clients whose requests Do does not see (base nil: http.DefaultTransport).
// A header the request already has is left as it is.
func Transport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return transport{base}
}

type transport struct{ base http.RoundTripper }

func (t transport) RoundTrip(req *http.Request) (*http.Response, error) {
	n := Attempt(req.Context())
	if n < 1 {
		return t.base.RoundTrip(req)
	}
	kept := callerSet(req.Header)
	if kept[0] && kept[1] {
		return t.base.RoundTrip(req)
	}
	r := req.Clone(req.Context()) // a RoundTripper must not change the request
	setAttemptHeaders(r.Header, n, kept)
	return t.base.RoundTrip(r)
}

// Middleware answers for a service whose own retries cannot help, so that
// its callers retry at one layer (docs/layers.md):
//
//   - while the breaker of any of policies (those the service calls its
//     dependencies with) is open, a request is answered at once with 503,
//     Backstop-No-Retry: circuit_open and X-Envoy-Overloaded: true, and next
//     is not run;
//   - when a Do loop running under the request's context gave up, a failed
//     response (status 400 or more) gets Backstop-No-Retry with the loop's
//     reason, unless the handler set it.
//
// An empty retry budget sheds nothing: a budget limits retries, never first
// calls.
func Middleware(next http.Handler, policies ...backstop.Decider) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now().UnixMilli()
		for _, p := range policies {
			if p == nil || !p.Stateful() {
				continue
			}
			if s, err := p.CircuitState(r.Context(), now); err == nil && s == policy.BreakerOpen {
				h := w.Header()
				h.Set(HeaderNoRetry, policy.CircuitOpen.String())
				h.Set(HeaderOverloaded, "true")
				http.Error(w, "circuit breaker open: not retried here; do not retry", http.StatusServiceUnavailable)
				return
			}
		}
		g := &gaveUp{}
		next.ServeHTTP(&markingWriter{ResponseWriter: w, gaveUp: g}, r.WithContext(context.WithValue(r.Context(), gaveUpKey{}, g)))
	})
}

type gaveUpKey struct{}

// gaveUp records the reason of the last Do loop of a request that gave up.
type gaveUp struct {
	mu     sync.Mutex
	reason string
}

// recordGaveUp tells the request's Middleware, if any, that a loop stopped.
func recordGaveUp(ctx context.Context, r policy.Reason) {
	if g, ok := ctx.Value(gaveUpKey{}).(*gaveUp); ok {
		g.mu.Lock()
		g.reason = r.String()
		g.mu.Unlock()
	}
}

func (g *gaveUp) get() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.reason
}

// markingWriter adds Backstop-No-Retry to a failed response when a loop
// of the request gave up before the header was written.
type markingWriter struct {
	http.ResponseWriter
	gaveUp  *gaveUp
	written bool
}

func (m *markingWriter) WriteHeader(code int) {
	if !m.written {
		m.written = true
		if reason := m.gaveUp.get(); code >= 400 && reason != "" && m.Header().Get(HeaderNoRetry) == "" {
			m.Header().Set(HeaderNoRetry, reason)
		}
	}
	m.ResponseWriter.WriteHeader(code)
}

func (m *markingWriter) Write(b []byte) (int, error) {
	if !m.written {
		m.WriteHeader(http.StatusOK)
	}
	return m.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the writer underneath.
func (m *markingWriter) Unwrap() http.ResponseWriter { return m.ResponseWriter }
