package queue

import (
	"fmt"
	"sort"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/internal/clientmetrics"
)

// WithPolicies decides the jobs of some job types by their own policy: a
// job whose Type is a key of m is acquired (its breaker asked before it
// runs), decided and recorded (RecordSuccess) by m[Type]; every other job,
// untyped ones among them, by the Runner's policy. One worker can so serve
// a mixed stream: a critical policy for charge_card, a batch one for
// render_report.
//
// # Notes
//
// A type's breaker defers that type's jobs only: unlike the Runner's
// policy, it does not pause the worker (PausedUntil). With WithMetrics, a
// type's policy is recorded under policy=<type>. NewRunner refuses a key
// that is not a valid job type (ValidJobType) or a nil policy.
func WithPolicies(m map[string]backstop.Decider) Option {
	return func(r *Runner) {
		r.policies = make(map[string]backstop.Decider, len(m))
		for t, p := range m {
			r.policies[t] = p
		}
	}
}

// bindPolicies checks WithPolicies' map and makes each type's runner: its
// own metrics and breaker pause (never read by PausedUntil).
func (r *Runner) bindPolicies() error {
	types := make([]string, 0, len(r.policies))
	for t := range r.policies {
		types = append(types, t)
	}
	sort.Strings(types)
	r.typed = make(map[string]*Runner, len(types))
	for _, t := range types {
		if err := ValidJobType(t); err != nil {
			return fmt.Errorf("queue: WithPolicies: key %q: %w", t, err)
		}
		if r.policies[t] == nil {
			return fmt.Errorf("queue: WithPolicies: policy of job type %q is nil", t)
		}
		tr := &Runner{p: r.policies[t], name: r.name, timeout: r.timeout, log: r.log, rand: r.rand, enqueueNow: r.enqueueNow}
		if r.metrics != nil {
			m, err := clientmetrics.Bind(r.metricsReg, t, r.name, "queue: WithPolicies")
			if err != nil {
				return err
			}
			tr.metrics = m
		}
		r.typed[t] = tr
	}
	return nil
}

// forType is the runner that decides a job of type t: its type's
// (WithPolicies), else r.
func (r *Runner) forType(t string) *Runner {
	if tr, ok := r.typed[t]; ok && t != "" {
		return tr
	}
	return r
}
