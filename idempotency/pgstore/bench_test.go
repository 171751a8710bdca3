package pgstore_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/backstop-dev/backstop/idempotency"
	"github.com/backstop-dev/backstop/idempotency/pgstore"
)

// A claim against the package's private PostgreSQL server over loopback:
// a first run (the row written) and a replay (a completed record read).
// BENCHMARKS.md, "The PostgreSQL claim in one statement".
func BenchmarkBegin(b *testing.B) {
	ctx := context.Background()
	store := pgstore.New(start(b), idempotency.WithMetrics(idempotency.NewMetrics()))
	keys := 0 // a new key for every first run, across the runs of the benchmark
	b.Run("first_run", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			keys++
			if c, err := store.Begin(ctx, "bench", "k"+strconv.Itoa(keys), "r"); err != nil || c.State != idempotency.Started {
				b.Fatal(c, err)
			}
		}
	})
	c, err := store.Begin(ctx, "bench", "done", "r")
	if err != nil {
		b.Fatal(err)
	}
	if err := store.Complete(ctx, "bench", "done", c.Token, idempotency.Response{Status: 201, Body: []byte("paid")}); err != nil {
		b.Fatal(err)
	}
	b.Run("replay", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if c, err := store.Begin(ctx, "bench", "done", "r"); err != nil || c.State != idempotency.Completed {
				b.Fatal(c, err)
			}
		}
	})
}
