package idempotency

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"time"
)

// ReplayedHeader marks a response replayed from the store.
const ReplayedHeader = "Idempotent-Replayed"

type mwOptions struct {
	header   string
	scope    func(*http.Request) string
	methods  []string
	stored   []string
	failOpen bool
	maxReq   int64
	release  func(status int) bool
}

// MiddlewareOption configures Middleware.
type MiddlewareOption func(*mwOptions)

// WithKeyHeader sets the request header that carries the key. Default
// "Idempotency-Key".
func WithKeyHeader(name string) MiddlewareOption { return func(o *mwOptions) { o.header = name } }

// WithScope sets the scope of keys (per user, per route, ...): two requests
// share a record only when scope and key are equal. Default "" (one scope).
func WithScope(f func(*http.Request) string) MiddlewareOption {
	return func(o *mwOptions) { o.scope = f }
}

// WithMethods sets the methods the middleware handles; others pass through.
// Default POST and PATCH (the policy's non-idempotent methods).
func WithMethods(m ...string) MiddlewareOption { return func(o *mwOptions) { o.methods = m } }

// WithStoredHeaders sets the response headers kept for a replay. Default
// Content-Type and Location.
func WithStoredHeaders(h ...string) MiddlewareOption { return func(o *mwOptions) { o.stored = h } }

// WithFailOpen runs the handler without the store when Redis cannot be
// reached. Default false: the request gets 503 and Retry-After (a
// non-idempotent request is never run without its guard).
func WithFailOpen(open bool) MiddlewareOption { return func(o *mwOptions) { o.failOpen = open } }

// WithMaxRequestBody sets the largest request body read to fingerprint a
// request; a larger one gets 413. Default 1 MiB.
func WithMaxRequestBody(n int64) MiddlewareOption { return func(o *mwOptions) { o.maxReq = n } }

// WithRelease sets which response statuses release the key (a retry may run
// again) instead of being stored. Default: the policy's retryable statuses
// 408, 429, 502, 503 and 504.
func WithRelease(f func(status int) bool) MiddlewareOption {
	return func(o *mwOptions) { o.release = f }
}

// DefaultRelease reports whether status is one the policy retries by
// default: such a response releases the key rather than being stored.
func DefaultRelease(status int) bool {
	switch status {
	case 408, 429, 502, 503, 504:
		return true
	}
	return false
}

// Fingerprint returns the request hash the adapters store beside a key:
// SHA-256 (hex) of method, "\n", path, "\n", body.
func Fingerprint(method, path string, body []byte) string {
	h := sha256.New()
	io.WriteString(h, method+"\n"+path+"\n")
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

// Middleware returns net/http middleware over store (any Backend): a request with an
// Idempotency-Key runs once; a retry with the same key and request gets the
// first response (marked Idempotent-Replayed: true), the same key with
// another request 422, a duplicate while the first runs 409 and
// Retry-After.
//
// # Notes
//
// Once the handler has run, its response is stored (or the key released)
// whatever happens to the request: a client that timed out or went away
// does not cancel the store call. A store call that fails is counted,
// logged, and retried in the background while the key's lease lasts; the
// client gets the response after the first attempt. If the store is still
// failing when the lease ends, the record stays in progress and the key may
// run again (at least once, not exactly once).
func Middleware(store Backend, opts ...MiddlewareOption) func(http.Handler) http.Handler {
	o := mwOptions{header: "Idempotency-Key", scope: func(*http.Request) string { return "" },
		methods: []string{"POST", "PATCH"}, stored: []string{"Content-Type", "Location"}, maxReq: 1 << 20, release: DefaultRelease}
	for _, f := range opts {
		f(&o)
	}
	cfg := store.Config()
	m := cfg.Metrics
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			key := r.Header.Get(o.header)
			if !slices.Contains(o.methods, r.Method) || (key == "" && len(r.Header.Values(o.header)) == 0) {
				next.ServeHTTP(w, r)
				return
			}
			if err := CheckKey(key); err != nil {
				http.Error(w, o.header+": "+err.Error(), http.StatusBadRequest)
				return
			}
			body, err := io.ReadAll(io.LimitReader(r.Body, o.maxReq+1))
			if err != nil {
				http.Error(w, "idempotency: reading the request body: "+err.Error(), http.StatusBadRequest)
				return
			}
			if int64(len(body)) > o.maxReq {
				http.Error(w, fmt.Sprintf("idempotency: request body over %d bytes", o.maxReq), http.StatusRequestEntityTooLarge)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			scope := o.scope(r)
			start := time.Now() // the lease runs from about here on the server's clock
			c, err := store.Begin(r.Context(), scope, key, Fingerprint(r.Method, r.URL.Path, body))
			if err != nil {
				if o.failOpen { // the key was checked: this is the store failing
					next.ServeHTTP(w, r)
					return
				}
				w.Header().Set("Retry-After", "1")
				http.Error(w, "idempotency store unavailable", http.StatusServiceUnavailable)
				return
			}
			switch c.State {
			case Conflict:
				m.requests.WithLabelValues("conflict").Inc()
				http.Error(w, o.header+" was used with a different request", http.StatusUnprocessableEntity)
				return
			case InProgress:
				m.requests.WithLabelValues("in_progress").Inc()
				w.Header().Set("Retry-After", strconv.Itoa(int(c.RetryAfter.Seconds())))
				http.Error(w, "a request with this "+o.header+" is in progress", http.StatusConflict)
				return
			case Completed:
				replay(w, c.Response, m)
				return
			}
			m.requests.WithLabelValues("first_run").Inc()
			// Whatever happens to the request from here (a client that
			// timed out, a store that fails), the record is completed or
			// released: settle detaches from r.Context() and retries
			// while the lease lasts, after the client has its answer.
			until := start.Add(cfg.Lease)
			release := func(ctx context.Context) error { return store.Fail(ctx, scope, key, c.Token) }
			rec := &recorder{ResponseWriter: w, status: http.StatusOK}
			done := false
			defer func() {
				if !done { // the handler panicked: a retry may run
					settle(cfg, r.Context(), "fail", key, until, release)
				}
			}()
			next.ServeHTTP(rec, r)
			done = true
			if o.release(rec.status) {
				settle(cfg, r.Context(), "fail", key, until, release)
			} else {
				h := map[string][]string{}
				for _, name := range o.stored {
					if v := rec.Header().Values(name); len(v) > 0 {
						h[http.CanonicalHeaderKey(name)] = v
					}
				}
				resp := Response{Status: rec.status, Headers: h, Body: rec.body.Bytes()}
				settle(cfg, r.Context(), "complete", key, until, func(ctx context.Context) error {
					return store.Complete(ctx, scope, key, c.Token, resp)
				})
			}
			rec.flush()
		})
	}
}

func replay(w http.ResponseWriter, resp *Response, m *Metrics) {
	w.Header().Set(ReplayedHeader, "true")
	if resp.TooLarge {
		m.requests.WithLabelValues("too_large").Inc()
		http.Error(w, "idempotency: the first response to this key was too large to store; it cannot be replayed", http.StatusInternalServerError)
		return
	}
	m.requests.WithLabelValues("replayed").Inc()
	for name, v := range resp.Headers {
		w.Header()[http.CanonicalHeaderKey(name)] = v
	}
	w.WriteHeader(resp.Status)
	w.Write(resp.Body)
}

// recorder holds the handler's response until the store has it, so a
// client never sees a response the store then fails to keep differently.
type recorder struct {
	http.ResponseWriter
	status int
	wrote  bool
	body   bytes.Buffer
}

func (r *recorder) WriteHeader(s int) {
	if !r.wrote {
		r.status, r.wrote = s, true
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	r.wrote = true
	return r.body.Write(b)
}

func (r *recorder) flush() {
	r.ResponseWriter.WriteHeader(r.status)
	r.ResponseWriter.Write(r.body.Bytes())
}
