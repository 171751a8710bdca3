package main

import (
	"context"
	"fmt"
	"sort"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/host"
	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// demoTyped is the demo queue whose stream carries three job types, each
// with its own failure mix and, but for render_report (the queue's
// policy), its own policy (redisqueue.WithPolicies); charge_card fails most.
const demoTyped = 2

// demoJobType is one job type of the typed queue.
type demoJobType struct {
	name   string
	policy string    // "" decided by the queue's policy
	mix    demoQueue // its downstream's failure mix (the name seeds it)
}

var demoJobTypes = []demoJobType{
	{name: "render_report", mix: demoQueue{name: "reports/render_report", unavailable: 15, throttled: 5, permanent: 5, timeout: 10}},
	{name: "send_email", policy: `{"name": "send_email", "max_attempts": 6,
		"backoff": {"base": "50ms", "cap": "1s"}, "jitter": {"mode": "equal"}}`,
		mix: demoQueue{name: "reports/send_email", unavailable: 10, throttled: 5, permanent: 1, timeout: 2}},
	{name: "charge_card", policy: `{"name": "charge_card", "max_attempts": 3, "max_elapsed": "10s",
		"backoff": {"base": "100ms", "cap": "1s"}}`,
		mix: demoQueue{name: "reports/charge_card", unavailable: 45, throttled: 5, permanent: 8, timeout: 5}},
}

// demoEnqueue adds the i-th job of queue k as id; on the typed queue the
// jobs take the three types in turn.
func demoEnqueue(ctx context.Context, q queue.Queue, k, i int, id string) (string, error) {
	var o queue.EnqueueOptions
	if k == demoTyped {
		o.Type = demoJobTypes[i%len(demoJobTypes)].name
	}
	return q.Enqueue(ctx, id, []byte(`{"demo":true}`), o)
}

// demoPolicies loads the typed queue's policies per job type (WithPolicies).
func demoPolicies(ctx context.Context, rt *host.Runtime) (map[string]backstop.Decider, error) {
	m := map[string]backstop.Decider{}
	for _, t := range demoJobTypes {
		if t.policy == "" {
			continue
		}
		p, err := rt.Load(ctx, []byte(t.policy))
		if err != nil {
			return nil, fmt.Errorf("demo: policy of job type %s: %w", t.name, err)
		}
		m[t.name] = p
	}
	return m, nil
}

// demoDownstream answers attempt j.Attempt of job j on queue k: the job
// type's downstream on the typed queue, else the queue's.
func demoDownstream(k int, dq demoQueue, j queue.Job, down bool) error {
	if k == demoTyped {
		for _, t := range demoJobTypes {
			if t.name == j.Type {
				return t.mix.downstream(j.ID, j.Attempt, down)
			}
		}
	}
	return dq.downstream(j.ID, j.Attempt, down)
}

// demoTypeLines writes the typed queue's per-type figures (its stats
// hash's t:<type>:... fields), one row per type under the queue's: the
// figures a stats hash counts per type (succeeded, retries, dead letters).
func demoTypeLines(t *demoTable, ts redisqueue.TypeStats, lastRetry map[string]int64, queuePolicy string) {
	types := make([]string, 0, len(ts.ByType))
	for t := range ts.ByType {
		types = append(types, t)
	}
	sort.Strings(types)
	for _, typ := range types {
		c := ts.ByType[typ]
		pol := queuePolicy
		for _, jt := range demoJobTypes {
			if jt.name == typ && jt.policy != "" {
				pol = (demoQueue{policy: jt.policy}).policyName()
			}
		}
		rate := c["attempts:retry"] - lastRetry[typ]
		lastRetry[typ] = c["attempts:retry"]
		t.row(" "+typ, pol, []string{"", n(c["attempts:success"]), "", "", "", n(rate), n(c["attempts:dead_letter"])}, byReason(c))
	}
}
