package docs_test

// The Go blocks of README.md, each run as written inside a test that
// declares what the block leaves to the reader (TestDocsEveryBlockIsRun
// checks that every Go block appears here).

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"testing"
	"time"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/host"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

func TestReadmeNative(t *testing.T) {
	resp := &http.Response{Header: http.Header{"Retry-After": {"0"}}}
	key, start := "order-42", time.Now()

	p, err := policy.Preset("default") // or policy.Parse(fileBytes): JSON or YAML
	d, err := p.Decide(policy.Failure{
		Attempt:    1, // the execution that just failed
		HTTPStatus: 503,
		RetryAfter: resp.Header.Get("Retry-After"),
		Method:     "POST", IdempotencyKey: key,
		ElapsedMs: time.Since(start).Milliseconds(),
		NowMs:     time.Now().UnixMilli(),
		Random:    rand.Float64(),
	})
	if d.Action == policy.Retry {
		time.Sleep(d.Delay())
	}

	if err != nil || d.Action != policy.Retry || d.Reason != policy.Transient {
		t.Fatalf("decision %+v, %v: want a transient retry", d, err)
	}
}

func TestReadmeWasm(t *testing.T) {
	ctx, dir := context.Background(), t.TempDir()
	failure := policy.Failure{Attempt: 1, HTTPStatus: 503, Random: 0.5}
	failures := []policy.Failure{failure, {Attempt: 1, HTTPStatus: 400}}

	rt, err := host.New(ctx, host.WithCompilationCache(dir))
	defer rt.Close(ctx)
	p, err := rt.Preset(ctx, "critical") // or rt.Load(ctx, fileBytes): JSON or YAML
	d, err := p.Decide(ctx, failure)
	ds, err := p.DecideBatch(ctx, failures, nil)

	if err != nil || d.Action != policy.Retry || len(ds) != 2 || ds[1].Reason != policy.PermanentError {
		t.Fatalf("decision %+v, batch %+v, %v", d, ds, err)
	}
}

func TestReadmeQueue(t *testing.T) {
	redisClient := redistest.Start(t).Client()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p, perr := policy.Preset("default")
	if perr != nil {
		t.Fatal(perr)
	}
	orderID, payload := "order-42", []byte(`{"sku": 7}`)
	var charged []string
	charge := func(ctx context.Context, j queue.Job) error {
		charged = append(charged, j.ID)
		cancel() // one job is enough: Work returns once its outcome is applied
		return nil
	}

	q := redisqueue.New(redisClient, "orders") // keys {orders}:jobs, :delayed, :dlq, :stats
	q.Enqueue(ctx, orderID, payload)
	err := q.Work(ctx, backstop.Native(p), func(ctx context.Context, j queue.Job) error {
		return charge(ctx, j) // nil acks; an error is classified and decided by the policy:
	}) // retry later (delayed set) or dead letter, atomically

	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	ok, err := redisClient.HGet(context.Background(), "{orders}:stats", "attempts:success").Result()
	if len(charged) != 1 || charged[0] != orderID || err != nil || ok != "1" {
		t.Fatalf("charged %v, attempts:success %q (%v): want the job run once and acked", charged, ok, err)
	}
}
