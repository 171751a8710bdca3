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
// untyped ones among them, by Work's policy. One Work loop can so serve a
// mixed stream: a critical policy for charge_card, a batch one for
// render_report.
//
// # Notes
//
// A type's breaker defers that type's jobs only: unlike Work's policy, it
// does not pause the reading of the stream. With WithMetrics, a type's
// policy is recorded under policy=<type>. Work refuses a key that is not a
// valid job type (ValidJobType) or a nil policy.
func WithPolicies(m map[string]backstop.Decider) WorkerOption {
	return func(w *worker) {
		w.policies = make(map[string]backstop.Decider, len(m))
		for t, p := range m {
			w.policies[t] = p
		}
	}
}

// typedPolicy is the worker state a type's policy runs with: its own
// metrics and breaker pause (never read by the read loop).
type typedPolicy struct {
	w *worker
	p backstop.Decider
}

// bindPolicies checks WithPolicies' map and prepares each type's state.
func (w *worker) bindPolicies(queueName string) error {
	types := make([]string, 0, len(w.policies))
	for t := range w.policies {
		types = append(types, t)
	}
	sort.Strings(types)
	w.typed = make(map[string]typedPolicy, len(types))
	for _, t := range types {
		if err := ValidJobType(t); err != nil {
			return fmt.Errorf("queue: WithPolicies: key %q: %w", t, err)
		}
		if w.policies[t] == nil {
			return fmt.Errorf("queue: WithPolicies: policy of job type %q is nil", t)
		}
		tw := &worker{consumer: w.consumer, openPoll: w.openPoll, log: w.log, rand: w.rand, minIdle: w.minIdle, timeout: w.timeout, name: w.name}
		if w.metrics != nil {
			m, err := clientmetrics.Bind(w.metricsReg, t, queueName, "queue: WithPolicies")
			if err != nil {
				return err
			}
			tw.metrics = m
		}
		w.typed[t] = typedPolicy{w: tw, p: w.policies[t]}
	}
	return nil
}

// policyFor returns the worker state and policy that decide a job of type
// t: its type's (WithPolicies), else w and p.
func (w *worker) policyFor(t string, p backstop.Decider) (*worker, backstop.Decider) {
	if tp, ok := w.typed[t]; ok && t != "" {
		return tp.w, tp.p
	}
	return w, p
}
