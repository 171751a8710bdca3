package backstop_test

import (
	"context"
	"fmt"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/policy"
)

// A native policy answers as the module would, through the one Decider
// that retry.Do and the queue workers take.
func ExampleNative() {
	p, err := policy.Parse([]byte(`{"max_attempts": 3, "backoff": {"base": "100ms", "cap": "1s"}, "jitter": {"mode": "none"}}`))
	if err != nil {
		panic(err)
	}
	var d backstop.Decider = backstop.Native(p)
	ctx := context.Background()
	for attempt := int64(1); attempt <= 3; attempt++ {
		dec, _ := d.Decide(ctx, policy.Failure{Attempt: attempt, HTTPStatus: 503})
		fmt.Println(attempt, dec.Action, dec.Reason, dec.Delay())
	}
	fmt.Println("stateful:", d.Stateful(), "on_open:", d.OnOpen())
	// Output:
	// 1 retry transient 100ms
	// 2 retry transient 200ms
	// 3 dead_letter max_attempts_reached 0s
	// stateful: false on_open: defer
}
