package idempotency

import "github.com/prometheus/client_golang/prometheus"

func MetricsRequests(m *Metrics, outcome string) prometheus.Counter {
	return m.requests.WithLabelValues(outcome)
}
func MetricsStoreErrors(m *Metrics, op string) prometheus.Counter {
	return m.storeErrors.WithLabelValues(op)
}
