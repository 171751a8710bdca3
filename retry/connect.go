package retry

import (
	"net"
	"net/http"
	"time"

	"github.com/backstop-dev/backstop"
)

// Dialer returns a net.Dialer whose Timeout is p's connect_timeout
// (http.DefaultTransport's 30 s when the policy has none: a zero Timeout
// would wait out the kernel's SYN retries) and whose KeepAlive is
// http.DefaultTransport's.
// A connect that runs out fails with a *net.OpError (dial, timeout), which
// ClassifyError names connect_timeout, not timeout: a request that never
// connected was never sent, so the policy may retry it even when it is not
// idempotent (idempotency.never_sent_kinds).
//
// The attempt's own deadline (attempt_timeout) still bounds the connect
// through the request's context: whichever ends first stops it.
func Dialer(p backstop.Decider) *net.Dialer {
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	if ms := p.ConnectTimeoutMs(); ms > 0 {
		d.Timeout = time.Duration(ms) * time.Millisecond
	}
	return d
}

// HTTPTransport returns a clone of http.DefaultTransport (of net/http's
// defaults when a program replaced it by another RoundTripper) that connects
// with Dialer(p): the policy's connect_timeout applied to every
// connection. Wrap it with Transport for the attempt headers:
//
//	client := &http.Client{Transport: retry.Transport(retry.HTTPTransport(p))}
//	resp, err := retry.Do(ctx, p, func(ctx context.Context) (*http.Response, error) {
//		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
//		return client.Do(req)
//	})
func HTTPTransport(p backstop.Decider) *http.Transport {
	base, ok := http.DefaultTransport.(*http.Transport)
	if !ok { // a program wrapped it (tracing, metrics): net/http's defaults
		base = &http.Transport{Proxy: http.ProxyFromEnvironment, ForceAttemptHTTP2: true, MaxIdleConns: 100,
			IdleConnTimeout: 90 * time.Second, TLSHandshakeTimeout: 10 * time.Second, ExpectContinueTimeout: time.Second}
	}
	t := base.Clone()
	t.DialContext = Dialer(p).DialContext
	return t
}
