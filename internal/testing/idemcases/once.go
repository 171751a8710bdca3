package idemcases

import (
	"context"
	"errors"
	"testing"

	"github.com/backstop-dev/backstop/idempotency"
)

// Once checks the worker's idempotency.Once on store (a fresh one, lease
// 30s): a job redelivered returns its recorded result; another request
// under its key is a conflict; a failure releases the key; a duplicate
// while the first runs is in progress with the lease left.
func Once(t *testing.T, store idempotency.Backend) {
	t.Helper()
	ctx := context.Background()
	effects := 0
	charge := func(context.Context) ([]byte, error) { effects++; return []byte("charged"), nil }
	a, errA := idempotency.Once(ctx, store, "jobs", "j1", "j1/10", charge)
	b, errB := idempotency.Once(ctx, store, "jobs", "j1", "j1/10", charge)
	if errA != nil || errB != nil || string(a) != "charged" || string(b) != "charged" || effects != 1 {
		t.Fatalf("%q %v, %q %v, %d effects: want one effect, its result twice", a, errA, b, errB, effects)
	}
	if _, err := idempotency.Once(ctx, store, "jobs", "j1", "j1/11", charge); !errors.Is(err, idempotency.ErrConflict) {
		t.Errorf("another request under j1: %v, want ErrConflict", err)
	}
	boom := errors.New("upstream timeout")
	if _, err := idempotency.Once(ctx, store, "jobs", "j2", "j2", func(context.Context) ([]byte, error) { return nil, boom }); !errors.Is(err, boom) {
		t.Fatalf("failing job: %v", err)
	}
	if out, err := idempotency.Once(ctx, store, "jobs", "j2", "j2", charge); err != nil || string(out) != "charged" || effects != 2 {
		t.Errorf("retry after a failure: %q %v, %d effects: want it run", out, err, effects)
	}
	// A duplicate delivery while the first still runs.
	var inner error
	idempotency.Once(ctx, store, "jobs", "j3", "j3", func(ctx context.Context) ([]byte, error) {
		_, inner = idempotency.Once(ctx, store, "jobs", "j3", "j3", charge)
		return nil, nil
	})
	var ip *idempotency.InProgressError
	if !errors.As(inner, &ip) || ip.RetryAfter.Seconds() != 30 {
		t.Errorf("duplicate while running: %v, want InProgressError with 30s", inner)
	}
}
