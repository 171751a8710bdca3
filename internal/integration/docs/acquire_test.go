package docs_test

// The Go block of docs/policy.md, "Asking before a call: acquire", run as
// written (TestDocsEveryBlockIsRun checks that it appears here).

import (
	"testing"
	"time"

	"github.com/backstop-dev/backstop/policy"
)

func TestPolicyDocAcquire(t *testing.T) {
	p, err := policy.Parse([]byte(`{"circuit_breaker": {"failure_threshold": 1, "open_for": "1s", "half_open_max_calls": 2}}`))
	now := time.Now().UnixMilli()
	p.Decide(policy.Failure{Attempt: 1, HTTPStatus: 503, NowMs: now}) // the failure opens the breaker
	refused := p.Acquire(now + 10)                                    // {Allowed: false, RetryInMs: 990, State: open}
	trial := p.Acquire(now + 1000)                                    // half-open: a trial call may leave
	p.RecordSuccess(now + 1200)                                       // its success closes the breaker

	if err != nil || refused != (policy.Permit{RetryInMs: 990, State: policy.BreakerOpen}) ||
		trial != (policy.Permit{Allowed: true, State: policy.BreakerHalfOpen}) ||
		p.CircuitState(now+1201) != policy.BreakerClosed {
		t.Fatalf("refused %+v, trial %+v, %v", refused, trial, err)
	}
}
