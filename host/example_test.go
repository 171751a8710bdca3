package host_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/backstop-dev/backstop/host"
	"github.com/backstop-dev/backstop/policy"
)

func Example() {
	ctx := context.Background()
	rt, err := host.New(ctx) // compiles the embedded backstop.wasm
	if err != nil {
		log.Fatal(err)
	}
	defer rt.Close(ctx)

	p, err := rt.Preset(ctx, "default")
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close(ctx)

	// The caller brings the clock and the randomness: same inputs, same
	// decision, in every host.
	d, err := p.Decide(ctx, policy.Failure{Attempt: 1, HTTPStatus: 503, Random: 0.5})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(d.Action, d.Delay(), d.Reason)

	d, _ = p.Decide(ctx, policy.Failure{Attempt: 2, HTTPStatus: 429, RetryAfter: "30", Random: 0.5})
	fmt.Println(d.Action, d.Delay(), d.Reason)

	d, _ = p.Decide(ctx, policy.Failure{Attempt: 1, HTTPStatus: 503, Method: "POST"})
	fmt.Println(d.Action, d.Reason)

	// A policy the module refuses says which field is wrong.
	_, err = rt.Load(ctx, []byte(`{"backoff": {"base": "1s", "cap": "100ms"}}`))
	var pe *host.PolicyError
	if errors.As(err, &pe) {
		fmt.Println(pe.Message)
	}
	// Output:
	// retry 500ms transient
	// retry 30s retry_after
	// dead_letter not_idempotent
	// invalid policy: backoff.cap: must be >= backoff.base (got 100ms < 1s)
}
