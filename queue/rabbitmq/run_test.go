package rabbitmq

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/queue"
)

// Issue 45: Run takes a delayed job from where it waits, a level's ready
// messages (no worker runs) or a worker's mover's hold, and publishes it
// to the work queue with its attempt kept and no due time; the limit holds
// across both; nothing else moves.
func TestRunFromTheLevelsAndTheMovers(t *testing.T) {
	srv := shared.Broker(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b, err := Open(ctx, srv.URL(), WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	q := b.Queue("run-levels")
	other := b.Queue("run-levels-other")
	for _, id := range []string{"a", "b", "c", "d"} {
		if err := q.Enqueue(ctx, id, []byte(id), Delay(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	if err := other.Enqueue(ctx, "a", []byte("other"), Delay(time.Hour)); err != nil {
		t.Fatal(err)
	}
	// No worker: the four wait ready in hold.L10.
	if r, err := q.Run(ctx, RunOptions{ID: "a"}); err != nil || r.Moved != 1 {
		t.Fatalf("run a from the level: %+v, %v", r, err)
	}
	if r, err := q.Run(ctx, RunOptions{ID: "zz"}); err != nil || r.Moved != 0 {
		t.Fatalf("run an unknown id: %+v, %v", r, err)
	}
	// A worker: its mover holds b, c, d (and other's a).
	var mu sync.Mutex
	ran := map[string][]queue.Job{}
	pol, err := policy.Parse([]byte(`{"max_attempts": 3}`))
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- q.Work(wctx, backstop.Native(pol), func(_ context.Context, j queue.Job) error {
			mu.Lock()
			defer mu.Unlock()
			ran[j.ID] = append(ran[j.ID], j)
			return nil
		})
	}()
	defer func() { stop(); <-done }()
	eventually.True(t, 30*time.Second, "a ran", func() bool { mu.Lock(); defer mu.Unlock(); return len(ran["a"]) == 1 })
	conn := srv.Dial(t)
	eventually.True(t, 30*time.Second, "the level's messages held by the mover", func() bool {
		ch, err := conn.Channel()
		if err != nil {
			return false
		}
		defer ch.Close()
		st, err := ch.QueueDeclarePassive(holdQueue+"10", true, false, false, false, nil)
		return err == nil && st.Messages == 0
	})
	r, err := q.Run(ctx, RunOptions{DueBefore: time.Now().Add(2 * time.Hour), Limit: 2})
	if err != nil || r.Moved != 2 || r.Left != 1 || r.Silent != 0 {
		t.Fatalf("run 2 due before +2h from the mover: %+v, %v; want 2 moved, 1 left", r, err)
	}
	if r, err := q.Run(ctx, RunOptions{DueBefore: time.Now(), Limit: 10}); err != nil || r.Moved != 0 {
		t.Fatalf("run due before now: %+v, %v; want none", r, err)
	}
	eventually.True(t, 30*time.Second, "two more ran", func() bool { mu.Lock(); defer mu.Unlock(); return len(ran) == 3 })
	if r, err := q.Run(ctx, RunOptions{DueBefore: time.Now().Add(2 * time.Hour), Limit: 10}); err != nil || r.Moved != 1 || r.Left != 0 {
		t.Fatalf("run the last: %+v, %v", r, err)
	}
	eventually.True(t, 30*time.Second, "all four ran", func() bool { mu.Lock(); defer mu.Unlock(); return len(ran) == 4 })
	mu.Lock()
	for id, js := range ran {
		if len(js) != 1 || js[0].Attempt != 1 || string(js[0].Payload) != id {
			t.Errorf("job %s ran %+v; want once, attempt 1, its payload", id, js)
		}
	}
	mu.Unlock()
	// other's job is still held: Run moved only its own queue's.
	oq := b.Queue("run-levels-other")
	if r, err := oq.Run(ctx, RunOptions{ID: "a"}); err != nil || r.Moved != 1 {
		t.Fatalf("run other's a: %+v, %v", r, err)
	}
	if got := drain(t, conn, "run-levels-other"); len(got) != 1 || string(got[0].Body) != "other" || got[0].Headers[HeaderDueMs] != nil {
		t.Fatalf("other's queue holds %d messages, want its a without a due time", len(got))
	}

	for _, c := range []struct {
		o    RunOptions
		want string
	}{
		{RunOptions{}, "give a job id or a due time bound"},
		{RunOptions{ID: "a", DueBefore: time.Now()}, "give a job id or a due time bound"},
		{RunOptions{ID: "a", Limit: 3}, "a limit goes with a due time bound"},
		{RunOptions{DueBefore: time.Now(), Limit: 10001}, "limit must be in 1..10000"},
	} {
		if _, err := q.Run(ctx, c.o); err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "run-levels") {
			t.Errorf("run %+v: %v, want %q naming the queue", c.o, err, c.want)
		}
	}
	if _, err := b.Queue("run-never-made").Run(ctx, RunOptions{ID: "a"}); !errors.Is(err, ErrNoQueue) {
		t.Errorf("run on a queue never made: %v, want ErrNoQueue", err)
	}
}
