package docs_test

import (
	"context"
	"errors"
	"testing"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// The README's job types block, as written: a charge_card job is decided
// by its own policy.
func TestReadmeJobTypes(t *testing.T) {
	redisClient := redistest.Start(t).Client()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	presets := map[string]*policy.Policy{}
	for _, name := range []string{"default", "critical", "batch"} {
		p, err := policy.Preset(name)
		if err != nil {
			t.Fatal(err)
		}
		presets[name] = p
	}
	p, critical, batch := presets["default"], presets["critical"], presets["batch"]
	q := redisqueue.New(redisClient, "orders")
	payload := []byte(`{"sku": 7}`)
	var ran []queue.Job
	handle := func(ctx context.Context, j queue.Job) error {
		ran = append(ran, j)
		cancel() // one job is enough: Work returns once its outcome is applied
		return nil
	}
	var err error

	q.Enqueue(ctx, "order-43", payload, redisqueue.WithJobType("charge_card"))
	err = q.Work(ctx, backstop.Native(p), handle, redisqueue.WithPolicies(map[string]backstop.Decider{
		"charge_card":   backstop.Native(critical), // few attempts, a breaker
		"render_report": backstop.Native(batch),    // many, slow
	}))

	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	n, err := redisClient.HGet(context.Background(), "{orders}:stats", "t:charge_card:attempts:success").Result()
	if len(ran) != 1 || ran[0].Type != "charge_card" || err != nil || n != "1" {
		t.Fatalf("ran %+v, t:charge_card:attempts:success %q (%v): want the typed job run once and counted by type", ran, n, err)
	}
}
