package host

import (
	"context"
	"sync"
	"testing"

	"github.com/backstop-dev/backstop/policy"
)

// The pool never holds more instances than its size, stateful policies
// spread over it round-robin, and each instance loads a stateless policy
// at most once.
func TestPoolBounds(t *testing.T) {
	ctx := context.Background()
	rt, err := New(ctx, SharedCache(), WithPoolSize(3))
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	p, _ := rt.Preset(ctx, "default")
	var wg sync.WaitGroup
	for range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				p.Decide(ctx, policy.Failure{Attempt: 1, HTTPStatus: 503})
			}
		}()
	}
	wg.Wait()
	all := rt.instances()
	if len(all) < 1 || len(all) > 3 {
		t.Fatalf("%d instances, want 1..3", len(all))
	}
	var pinned []*instance
	for range 6 {
		s, err := rt.Load(ctx, []byte(`{"circuit_breaker": {}}`))
		if err != nil {
			t.Fatal(err)
		}
		pinned = append(pinned, s.pinned.Load())
		if _, err := s.Decide(ctx, policy.Failure{Attempt: 1, HTTPStatus: 503, NowMs: 1767225600000}); err != nil {
			t.Fatal(err)
		}
		// The stateful policy lives only in its pinned instance.
		for _, in := range rt.instances() {
			in.mu.Lock()
			_, ok := in.handles[s.id]
			in.mu.Unlock()
			if ok != (in == s.pinned.Load()) {
				t.Errorf("policy %d: loaded in a non-pinned instance (or not in its own)", s.id)
			}
		}
	}
	if len(rt.instances()) != 3 || pinned[0] == pinned[1] || pinned[1] == pinned[2] || pinned[0] != pinned[3] {
		t.Errorf("stateful policies not spread round-robin over 3 instances")
	}
	for _, in := range rt.instances() {
		if len(in.handles) > 3 {
			t.Errorf("instance holds %d handles", len(in.handles))
		}
	}
	p.Close(ctx)
	for _, in := range rt.instances() {
		if _, ok := in.handles[p.id]; ok {
			t.Error("Close left a handle behind")
		}
	}
}
