package idempotency

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the store's and the middleware's counters, with the same
// names in Go, Node.js and Python:
//
//	backstop_idempotency_requests_total{outcome}   first_run, replayed, in_progress, conflict, too_large
//	backstop_idempotency_lease_expiries_total      keys taken over from an owner whose lease ran out
//	backstop_idempotency_lease_lost_total          Complete/Fail by an owner that lost its key
//	backstop_idempotency_store_errors_total{operation}  begin, complete, fail: the store (Redis, PostgreSQL) failed
type Metrics struct {
	requests      *prometheus.CounterVec
	leaseExpiries prometheus.Counter
	leaseLost     prometheus.Counter
	storeErrors   *prometheus.CounterVec
}

// NewMetrics returns a fresh set of counters; register it with
// prometheus.Registerer.MustRegister (Metrics is a prometheus.Collector).
func NewMetrics() *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "backstop_idempotency_requests_total",
			Help: "Requests carrying an idempotency key, by outcome: first_run, replayed, in_progress, conflict, too_large."}, []string{"outcome"}),
		leaseExpiries: prometheus.NewCounter(prometheus.CounterOpts{Name: "backstop_idempotency_lease_expiries_total",
			Help: "Keys taken over because their owner's lease ran out (a crashed or slow request)."}),
		leaseLost: prometheus.NewCounter(prometheus.CounterOpts{Name: "backstop_idempotency_lease_lost_total",
			Help: "Complete or fail refused because the caller no longer owned its key."}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "backstop_idempotency_store_errors_total",
			Help: "Calls to the idempotency store that failed, by operation: begin, complete, fail."}, []string{"operation"}),
	}
	// Every series exists from the start, so rate() sees the first increase.
	for _, o := range []string{"first_run", "replayed", "in_progress", "conflict", "too_large"} {
		m.requests.WithLabelValues(o)
	}
	for _, o := range []string{"begin", "complete", "fail"} {
		m.storeErrors.WithLabelValues(o)
	}
	return m
}

// DefaultMetrics are the counters of stores built without WithMetrics,
// registered with prometheus.DefaultRegisterer.
var DefaultMetrics = func() *Metrics {
	m := NewMetrics()
	prometheus.MustRegister(m)
	return m
}()

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.requests.Describe(ch)
	m.leaseExpiries.Describe(ch)
	m.leaseLost.Describe(ch)
	m.storeErrors.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.requests.Collect(ch)
	m.leaseExpiries.Collect(ch)
	m.leaseLost.Collect(ch)
	m.storeErrors.Collect(ch)
}

// CountStoreError counts a store call that failed (op: begin, complete or
// fail). For Backend implementations.
func (m *Metrics) CountStoreError(op string) { m.storeErrors.WithLabelValues(op).Inc() }

// CountLeaseExpiry counts a key taken over from an owner whose lease ran
// out. For Backend implementations.
func (m *Metrics) CountLeaseExpiry() { m.leaseExpiries.Inc() }

// CountLeaseLost counts a Complete or Fail refused because the caller no
// longer owned its key. For Backend implementations.
func (m *Metrics) CountLeaseLost() { m.leaseLost.Inc() }

// CountRequest counts a request (or Once call) by outcome: first_run,
// replayed, in_progress, conflict, too_large. For callers that answer a
// claim themselves (pgstore's OnceTx).
func (m *Metrics) CountRequest(outcome string) { m.requests.WithLabelValues(outcome).Inc() }
