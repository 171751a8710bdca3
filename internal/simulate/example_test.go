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
