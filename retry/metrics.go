package retry

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

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
func stateAt(ctx context.Context, m *clientmetrics.Recorder, p Policy, nowMs int64) {
	if m == nil {
		return
	}
	if s, err := p.CircuitState(ctx, nowMs); err == nil {
		m.State(s)
	}
	if b, ok := p.(budgeter); ok {
		if milli, ok, err := b.BudgetTokens(ctx, nowMs); err == nil && ok {
			m.Budget(milli)
		}
	}
}

// budgeter is a Policy that reports its retry budget: the native policy
// and *host.Policy. Optional, so Policy stays small.
type budgeter interface {
	BudgetTokens(ctx context.Context, nowMs int64) (milli int64, ok bool, err error)
}
