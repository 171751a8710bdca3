package retry

import (
	"math/rand/v2"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/backstop-dev/backstop/policy"
)

// Option configures one Do call.
type Option func(*config)

type config struct {
	clock          clock
	random         func() float64
	method         string
	idempotencyKey string
	req            *http.Request // WithRequest's: gets the attempt headers
	noHeaders      bool
	metrics        *metricsKey
}

// defaults is the configuration every Do call starts from.
var defaults = config{clock: realClock{}, random: rand.Float64}

// WithRequest tells the policy the request's method and Idempotency-Key
// header, for failures that carry no response (a refused connection, a
// timeout). A failed *http.Response names its own request.
//
// Before each attempt, Do sets the attempt headers on req
// (Backstop-Attempt and X-Envoy-Attempt-Count: docs/layers.md), except
// those req already had, and removes them when it returns;
// WithoutAttemptHeaders turns that off.
//
// By default the policy sees no method, and treats the call as idempotent.
func WithRequest(req *http.Request) Option {
	return func(c *config) {
		if req != nil {
			c.method = req.Method
			c.idempotencyKey = req.Header.Get("Idempotency-Key")
			c.req = req
		}
	}
}

// WithoutAttemptHeaders keeps Do from setting the attempt headers on
// WithRequest's request (for a peer that must not see them).
func WithoutAttemptHeaders() Option {
	return func(c *config) { c.noHeaders = true }
}

// WithMetrics counts attempts, retries, refusals, retry delays and breaker
// state in reg, under the backstop_client_* families every language
// exports, labelled policy=policyName and target=target. Choose both from a
// small fixed set (a dependency's name, never a URL or an id).
//
// # Notes
//
// Calls with the same registry share its collectors: a second WithMetrics
// on a registry reuses the families the first one registered.
//
// # Errors
//
// Do returns an error before the first attempt when policyName or target is
// empty or not valid UTF-8, or when reg holds other collectors under the
// same names.
func WithMetrics(reg prometheus.Registerer, policyName, target string) Option {
	return func(c *config) {
		c.metrics = &metricsKey{reg: reg, policy: policyName, target: target}
	}
}

func (c *config) request(f *policy.Failure) {
	if f.Method == "" {
		f.Method = c.method
	}
	if f.IdempotencyKey == "" {
		f.IdempotencyKey = c.idempotencyKey
	}
}
