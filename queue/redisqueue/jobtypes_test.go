package redisqueue_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// typeSpy is a policy that notes which jobs it was asked about (by job id)
// and how often it was asked before a job and told of a success.
type typeSpy struct {
	backstop.Decider // what the spy does not count
	p                *policy.Policy
	mu               sync.Mutex
	// decided, acquired, success count the events (Outcome).
	decided           map[string]int
	acquired, success int
}

func newSpy(t *testing.T, js string) *typeSpy {
	t.Helper()
	p, err := policy.Parse([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	return &typeSpy{Decider: backstop.Native(p), p: p, decided: map[string]int{}}
}

// Outcome counts the events: a failure by its job's id, the gates
// (before) and the successes.
func (s *typeSpy) Outcome(_ context.Context, e policy.JobEvent) (policy.Outcome, error) {
	s.mu.Lock()
	switch e.Event {
	case policy.EventFailure:
		s.decided[e.Failure.IdempotencyKey]++
	case policy.EventBefore:
		s.acquired++
	case policy.EventSuccess:
		s.success++
	}
	s.mu.Unlock()
	return s.p.Outcome(e)
}

// kinds returns the job types (the ids' prefixes) of the jobs the spy decided.
func (s *typeSpy) kinds() map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]bool{}
	for id := range s.decided {
		out[id[:strings.LastIndex(id, "-")]] = true
	}
	return out
}

// One Work loop over a stream of three job types, one of them failing:
// each type is decided by its own policy (WithPolicies), counted by type in
// the stats hash, and replayed alone.
func TestJobTypesWork(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client()
	q := redisqueue.New(rdb, "mixed")
	for i, typ := range []string{"send_email", "charge_card", "render_report", "send_email", "charge_card", "render_report", "send_email", "charge_card", "render_report"} {
		if _, err := q.Enqueue(ctx, typ+"-"+string(rune('a'+i)), []byte("x"), redisqueue.WithJobType(typ)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := q.Enqueue(ctx, "untyped-z", []byte("x")); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"a:b", strings.Repeat("t", 65), "b\x00", "send email"} {
		if _, err := q.Enqueue(ctx, "bad", nil, redisqueue.WithJobType(bad)); err == nil || !strings.Contains(err.Error(), "job type") {
			t.Fatalf("Enqueue with type %q: %v, want a refusal naming the job type", bad, err)
		}
	}
	if n, _ := rdb.XLen(ctx, q.Keys().Jobs).Result(); n != 10 {
		t.Fatalf("%d entries after the refused enqueues, want 10", n)
	}

	fast := `"backoff": {"base": "5ms", "cap": "10ms"}, "jitter": {"mode": "none"}`
	base := newSpy(t, `{"max_attempts": 5, `+fast+`}`)
	critical := newSpy(t, `{"max_attempts": 2, `+fast+`}`)
	batch := newSpy(t, `{"max_attempts": 3, `+fast+`}`)
	var mu sync.Mutex
	seen := map[string]int{}
	h := func(ctx context.Context, j queue.Job) error {
		mu.Lock()
		seen[j.ID]++
		n := seen[j.ID]
		mu.Unlock()
		switch {
		case j.Type == "charge_card":
			return &backstop.Failure{HTTPStatus: 503, Err: errors.New("card processor down")}
		case j.Type == "send_email" && n == 1:
			return &backstop.Failure{HTTPStatus: 503, Err: errors.New("smtp busy")}
		case j.ID == "render_report-c":
			return &backstop.Failure{HTTPStatus: 400, Err: errors.New("bad template")}
		}
		return nil
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- q.Work(wctx, base, h, redisqueue.WithConsumer("w1"), redisqueue.WithBatch(4, 20*time.Millisecond),
			redisqueue.WithPromote(10*time.Millisecond, 100),
			redisqueue.WithPolicies(map[string]backstop.Decider{"charge_card": critical, "render_report": batch}))
	}()
	var s redisqueue.Stats
	eventually.True(t, 20*time.Second, "every job to finish", func() bool {
		var err error
		s, err = q.Stats(ctx)
		return err == nil && s.Counters["attempts:success"] == 6 && s.Counters["attempts:dead_letter"] == 4
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// Each type was decided by its own policy, the rest by Work's.
	for spy, want := range map[*typeSpy]string{base: "send_email", critical: "charge_card", batch: "render_report"} {
		if k := spy.kinds(); len(k) != 1 || !k[want] {
			t.Errorf("policy for %s decided jobs of %v", want, k)
		}
	}
	if critical.success != 0 || batch.success != 2 || critical.acquired != 6 || batch.acquired != 3 {
		t.Errorf("charge_card policy: %d successes, %d acquires (want 0, 6); render_report: %d, %d (want 2, 3)",
			critical.success, critical.acquired, batch.success, batch.acquired)
	}
	// charge_card gave up at its policy's 2 attempts, not Work's 5.
	byType := s.Types.ByType
	for typ, want := range map[string]map[string]int64{
		"charge_card": {"attempts:retry": 3, "attempts:dead_letter": 3, "max_attempts_reached": 3, "dead_letters:max_attempts_reached": 3,
			"finished:dead_letter:2": 3, "finished_sum:dead_letter": 6},
		"send_email":    {"attempts:retry": 3, "retries:transient": 3, "attempts:success": 3, "finished:success:2": 3},
		"render_report": {"attempts:success": 2, "attempts:dead_letter": 1, "dead_letters:permanent_error": 1},
	} {
		for f, n := range want {
			if byType[typ][f] != n {
				t.Errorf("%s %s = %d, want %d (stats %v)", typ, f, byType[typ][f], n, byType[typ])
			}
		}
	}
	if s.Types.Registered != 3 || s.Types.Overflow != 0 || len(byType) != 3 || s.Counters["attempts:success"] != 6 {
		t.Errorf("types %+v, counters %v", s.Types, s.Counters)
	}

	// Replay by type moves only that type.
	if _, err := q.Replay(ctx, 10, "", redisqueue.ReplayJobType("a:b")); err == nil {
		t.Fatal("Replay with type a:b: no error")
	}
	n, err := q.Replay(ctx, 10, "", redisqueue.ReplayJobType("charge_card"))
	if err != nil || n != 3 {
		t.Fatalf("Replay charge_card: %d, %v; want 3", n, err)
	}
	left, _ := rdb.XRange(ctx, q.Keys().DLQ, "-", "+").Result()
	if len(left) != 1 || left[0].Values["type"] != "render_report" || left[0].Values["id"] != "render_report-c" {
		t.Fatalf("DLQ after the replay: %v", left)
	}
	jobs, _ := rdb.XRange(ctx, q.Keys().Jobs, "-", "+").Result()
	if len(jobs) != 3 {
		t.Fatalf("jobs after the replay: %v", jobs)
	}
	for _, m := range jobs {
		if m.Values["type"] != "charge_card" || m.Values["attempt"] != "1" {
			t.Fatalf("replayed %v", m.Values)
		}
	}
	r, err := q.InspectDLQ(ctx, 5, 100)
	if err != nil || len(r.Newest) != 1 || r.Newest[0].Type != "render_report" {
		t.Fatalf("InspectDLQ: %+v, %v", r, err)
	}
}

// Past the limit, a new type is counted as other and in types:overflow.
func TestJobTypesLimit(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client()
	q := redisqueue.New(rdb, "lim")
	if err := q.SetTypeLimit(ctx, 0); err == nil {
		t.Fatal("SetTypeLimit(0): no error")
	}
	if err := q.SetTypeLimit(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := q.EnsureGroup(ctx); err != nil {
		t.Fatal(err)
	}
	for _, typ := range []string{"a", "b", "a", "b"} {
		if _, err := q.Enqueue(ctx, "j-"+typ, nil, redisqueue.WithJobType(typ)); err != nil {
			t.Fatal(err)
		}
	}
	msgs, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: q.Group(), Consumer: "c", Streams: []string{q.Keys().Jobs, ">"}, Count: 10}).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs[0].Messages {
		if ok, err := q.Ack(ctx, m.ID); !ok || err != nil {
			t.Fatalf("ack %s: %v %v", m.ID, ok, err)
		}
	}
	s, err := q.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s.Types.Limit != 1 || s.Types.Registered != 1 || s.Types.Overflow != 2 ||
		s.Types.ByType["a"]["attempts:success"] != 2 || s.Types.ByType["other"]["attempts:success"] != 2 || s.Types.ByType["b"] != nil {
		t.Fatalf("types %+v", s.Types)
	}
}
