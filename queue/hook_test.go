package queue_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"reflect"
	"strings"
	"testing"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/queue"
)

// Issue 45: Applied tells the hook the outcome with the job, the class the
// policy decided and the error; a hook that panics is logged, not the
// worker's end; without a hook Applied does nothing.
func TestOutcomeHook(t *testing.T) {
	p, err := policy.Parse([]byte(`{"max_attempts": 1}`))
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	var got []queue.OutcomeEvent
	r, err := queue.NewRunner("payments", backstop.Native(p), queue.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))),
		queue.WithOutcomeHook(func(_ context.Context, e queue.OutcomeEvent) {
			got = append(got, e)
			if e.Job.ID == "boom" {
				panic("the pager is down")
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	j := queue.Job{ID: "order-42", Attempt: 1, Type: "charge_card"}
	o := r.Run(ctx, func(context.Context, queue.Job) error {
		return &backstop.Failure{HTTPStatus: 400, Err: errors.New("card declined")}
	}, j)
	r.Applied(ctx, j, o)
	want := queue.OutcomeEvent{Queue: "payments", Job: j, Action: queue.DeadLetter, Reason: "permanent_error", Class: "permanent", Error: o.LastError}
	if len(got) != 1 || !reflect.DeepEqual(got[0], want) || !strings.Contains(o.LastError, "card declined") {
		t.Fatalf("told %+v, want %+v", got, want)
	}
	r.Applied(ctx, queue.Job{ID: "boom"}, queue.Outcome{Action: queue.Ack, Reason: "success"})
	if len(got) != 2 || !strings.Contains(logs.String(), "queue outcome hook panicked") {
		t.Errorf("a panicking hook: told %d, logs %q", len(got), logs.String())
	}
	plain, err := queue.NewRunner("payments", backstop.Native(p))
	if err != nil {
		t.Fatal(err)
	}
	plain.Applied(ctx, j, o) // no hook: nothing
}
