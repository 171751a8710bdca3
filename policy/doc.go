// Package policy is backstop's retry policy core: pure Go, no I/O, no
// clock, no ambient randomness. A policy file (JSON, or the YAML subset of
// docs/policy.md) or a preset name becomes a *Policy; a Failure becomes a
// Decision (retry after DelayMs, or dead_letter with a Reason); a queue
// worker's job event becomes an Outcome. The same package, compiled to
// backstop.wasm (wasm/), decides for every other language, and
// testdata/vectors and testdata/outcomes prove the answers are the same
// byte for byte.
//
// A policy file, parsed once, decides each failure. Time and randomness
// are inputs, so a decision is a pure function of the failure, the policy
// and its breaker and budget state:
//
//	p, err := policy.Parse([]byte(`
//	max_attempts: 4
//	backoff: {strategy: exponential, base: 200ms, cap: 5s}
//	circuit_breaker: {failure_threshold: 5, open_for: 30s}
//	`))
//	if err != nil {
//		return err // names each invalid field: "invalid policy: backoff.cap: …"
//	}
//	d, err := p.Decide(policy.Failure{Attempt: 1, HTTPStatus: 503, RetryAfter: "2",
//		NowMs: time.Now().UnixMilli(), Random: rand.Float64()})
//	if d.Action == policy.Retry {
//		time.Sleep(d.Delay())
//	}
//
// A queue worker asks the Outcome of each event of a job instead: the
// breaker's gate before it runs, its success or its failure after, a crash
// loop when a broker delivered it too often. The answer says what to do
// with the job (run, ack, retry, defer, dead_letter), how long it waits,
// whether the worker pauses, and which metric to count, so the worker only
// runs the handler and applies the answer:
//
//	o, _ := p.Outcome(policy.JobEvent{Event: policy.EventBefore, Failure: policy.Failure{NowMs: now}})
//	if o.Action == policy.OutcomeRun {
//		if err := handle(job); err != nil {
//			o, _ = p.Outcome(policy.JobEvent{Event: policy.EventFailure, Failure: policy.Failure{
//				Attempt: job.Attempt, IdempotencyKey: job.ID, HTTPStatus: 503, NowMs: now, Random: rand.Float64()}})
//		} else {
//			o, _ = p.Outcome(policy.JobEvent{Event: policy.EventSuccess, Failure: policy.Failure{NowMs: now}})
//		}
//	}
//
// Most Go code reaches a policy through backstop.Decider (backstop.Native
// over a *Policy, or a *host.Policy running in backstop.wasm), which
// retry.Do and the queue workers take.
package policy
