package docs_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// fakePager records the pages, and stops the example's worker at the first.
type fakePager struct {
	sent []string
	stop context.CancelFunc
}

func (f *fakePager) Page(_ context.Context, text string) {
	f.sent = append(f.sent, text)
	f.stop()
}

// Issue 45: docs/monitoring.md's "Page on a dead letter of a job type",
// as written: the outcome hook pages on the charge_card job's dead letter.
func TestMonitoringDocOutcomeHook(t *testing.T) {
	redisClient := redistest.Start(t).Client()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p, err := policy.Parse([]byte(`{"max_attempts": 1}`))
	if err != nil {
		t.Fatal(err)
	}
	pager := &fakePager{stop: cancel}
	payload := []byte(`{"amount": 1200}`)
	charge := func(ctx context.Context, j queue.Job) error {
		return &backstop.Failure{ErrorKind: "connection_refused", Err: errors.New("payment gateway down")}
	}

	payments := redisqueue.New(redisClient, "payments")
	payments.Enqueue(ctx, "order-42", payload, redisqueue.WithJobType("charge_card"))
	err = payments.Work(ctx, backstop.Native(p), charge, redisqueue.WithOutcomeHook(func(ctx context.Context, e queue.OutcomeEvent) {
		// A charge_card job dead-lettered: a customer was not charged.
		if e.Action == queue.DeadLetter && e.Job.Type == "charge_card" {
			pager.Page(ctx, fmt.Sprintf("%s: job %s dead-lettered (%s, %s): %s", e.Queue, e.Job.ID, e.Reason, e.Class, e.Error))
		}
	}))

	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if len(pager.sent) != 1 || pager.sent[0] != "payments: job order-42 dead-lettered (max_attempts_reached, retryable): payment gateway down" {
		t.Fatalf("paged %q", pager.sent)
	}
}
