package queue_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/queue"
)

// A broker's worker reads a delivery into a Job, lets the Runner decide
// it, and applies the Outcome through its own atomic move: the Runner asks
// the breaker, runs the handler, classifies its error and has the policy
// decide, the same on every broker.
func ExampleRunner() {
	p, err := policy.Parse([]byte(`{"max_attempts": 3, "backoff": {"base": "100ms", "cap": "1s"}, "jitter": {"mode": "none"}}`))
	if err != nil {
		panic(err)
	}
	r, err := queue.NewRunner("orders", backstop.Native(p), queue.WithHandlerTimeout(time.Second))
	if err != nil {
		panic(err)
	}
	charge := func(ctx context.Context, j queue.Job) error {
		if j.Attempt < 3 {
			return &backstop.Failure{HTTPStatus: 503, Err: errors.New("payments answered 503")}
		}
		return &backstop.Failure{HTTPStatus: 400, Err: errors.New("card declined")}
	}
	for attempt := int64(1); attempt <= 3; attempt++ {
		job := queue.Job{ID: "order-42", Attempt: attempt, FirstEnqueuedMs: time.Now().UnixMilli()}
		o := r.Run(context.Background(), charge, job)
		fmt.Println(attempt, o.Action, o.Reason, o.Delay, o.LastError)
	}
	// Output:
	// 1 retry transient 100ms payments answered 503
	// 2 retry transient 200ms payments answered 503
	// 3 dead_letter permanent_error 0s card declined
}
