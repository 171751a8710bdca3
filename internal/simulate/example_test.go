package simulate_test

import (
	"fmt"
	"time"

	"github.com/backstop-dev/backstop/internal/simulate"
)

// A thousand clients of the default preset (exponential from 1s, full
// jitter, 5 attempts) against a dependency down for 5s that then serves
// 200 calls per second.
func ExampleHerd() {
	r, err := simulate.Herd([]byte("default"), 1000,
		simulate.WithRecovery(5*time.Second), simulate.WithCapacity(200), simulate.WithSeed(1))
	if err != nil {
		panic(err)
	}
	fmt.Printf("%d calls, %d retries; %d clients served, p50 %dms\n", r.Calls, r.Retries, r.Succeeded(), r.Percentile(0.5))
	for _, g := range r.GaveUp {
		fmt.Printf("gave up: %s %d\n", g.Reason, g.Clients)
	}
	// Output:
	// 4853 calls, 3853 retries; 784 clients served, p50 7446ms
	// gave up: max_attempts_reached 216
}

// One request through 1 to 3 layers of 3 attempts each, to a service
// that stays down: 3, 9, 27 calls when every layer retries; 3 when a layer
// gives up what a layer below already retried.
func ExampleLayers() {
	three := []byte(`{"name": "three", "max_attempts": 3, "jitter": {"mode": "none"}}`)
	rows, err := simulate.Layers(three, 3, simulate.WithRecovery(time.Hour))
	if err != nil {
		panic(err)
	}
	for _, r := range rows {
		fmt.Printf("%d layers: %d calls without the rule (%s), %d with it (%s)\n",
			r.Layers, r.Without.BottomCalls, r.Without.Reason, r.With.BottomCalls, r.With.Reason)
	}
	// Output:
	// 1 layers: 3 calls without the rule (max_attempts_reached), 3 with it (max_attempts_reached)
	// 2 layers: 9 calls without the rule (max_attempts_reached), 3 with it (retried_downstream)
	// 3 layers: 27 calls without the rule (max_attempts_reached), 3 with it (retried_downstream)
}
