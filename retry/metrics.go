package retry

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/internal/clientmetrics"
)

type metricsKey struct {
	reg            prometheus.Registerer
	policy, target string
}

// recorder returns the metrics of c, nil (recording nothing) when c has
// none.
func (c *config) recorder() (*clientmetrics.Recorder, error) {
	if k := c.metrics; k != nil {
		return clientmetrics.Bind(k.reg, k.policy, k.target, "retry: WithMetrics")
	}
	return nil, nil
}

// stateAt records the breaker's state and the budget left at nowMs.
func stateAt(ctx context.Context, m *clientmetrics.Recorder, p backstop.Decider, nowMs int64) {
	if m == nil {
		return
	}
	if s, err := p.CircuitState(ctx, nowMs); err == nil {
		m.State(s)
	}
	if milli, ok, err := p.BudgetTokens(ctx, nowMs); err == nil && ok {
		m.Budget(milli)
	}
}
