package reliability

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/internal/testing/logbuf"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/rabbitmq"
)

// runs records each execution of a job's attempt, for duplicates.
type runs struct {
	mu   sync.Mutex
	at   []time.Time
	n    map[string]int   // "id attempt" → executions
	done map[string]int64 // id → the attempt that succeeded
}

func newRuns() *runs { return &runs{n: map[string]int{}, done: map[string]int64{}} }

func (r *runs) record(j queue.Job, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n[fmt.Sprintf("%s %d", j.ID, j.Attempt)]++
	r.at = append(r.at, time.Now())
	if ok {
		r.done[j.ID] = j.Attempt
	}
}

// counts returns how many jobs succeeded, how many attempts ran, and the
// attempts that ran more than once.
func (r *runs) counts() (succeeded, executions int, twice []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, n := range r.n {
		executions += n
		if n > 1 {
			twice = append(twice, fmt.Sprintf("%s ×%d", k, n))
		}
	}
	return len(r.done), executions, twice
}

// quiet waits until the executions stop changing for a few polls: late
// duplicates (an outcome published twice) would come within the 1 s
// delays.
func (r *runs) quiet(t *testing.T) {
	last, stable := -1, 0
	eventually.True(t, 30*time.Second, "the executions to settle", func() bool {
		_, n, _ := r.counts()
		if n == last {
			stable++
		} else {
			last, stable = n, 0
		}
		return stable >= 15 // polled every 200ms by eventually: about 3 s
	})
}

// TestMemoryAlarmRunsNothingTwice: 200 jobs that fail once (503, retried
// after 1 s) and then succeed; while they run, the broker's memory alarm
// blocks the connection for 15 s (longer than the worker's apply timeout,
// 10 s, which used to time a confirm out into "not published", so the
// outcome was published again when the alarm cleared, and the mover's
// moves too). No attempt runs twice, every job succeeds at attempt 2, none
// is dead-lettered, and the blocked connection is logged once.
func TestMemoryAlarmRunsNothingTwice(t *testing.T) {
	const jobs = 200
	broker := shared.Broker(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logs logbuf.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	b, err := rabbitmq.Open(ctx, broker.URL(), rabbitmq.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	q := b.Queue("alarmed")
	if err := q.Declare(ctx); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, jobs)
	for i := range ids {
		ids[i] = fmt.Sprintf("m%05d", i)
	}
	enqueueAll(t, b, q, ids)
	p, err := policy.Parse([]byte(workerPolicy))
	if err != nil {
		t.Fatal(err)
	}
	r := newRuns()
	// The jobs after the first quarter wait for the alarm, so that it
	// finds work in hand however fast the machine.
	alarmOn := make(chan struct{})
	var started atomic.Int64
	handler := func(_ context.Context, j queue.Job) error {
		var err error
		if j.Attempt == 1 {
			if started.Add(1) > jobs/4 {
				<-alarmOn
			}
			err = &backstop.Failure{HTTPStatus: 503, Err: errors.New("503 unavailable")}
		}
		r.record(j, err == nil)
		return err
	}
	done := make(chan error, 1)
	go func() { done <- q.Work(ctx, backstop.Native(p), handler, rabbitmq.WithPrefetch(16)) }()
	alarm := func(v string) {
		if out, err := broker.Ctl("set_vm_memory_high_watermark", v); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
	}
	// The alarm once the jobs are under way, some retried, some waiting
	// in the handler for it.
	eventually.True(t, 30*time.Second, "the first jobs to run", func() bool {
		_, n, _ := r.counts()
		return n >= jobs/4
	})
	alarm("0.0001")
	t.Cleanup(func() { broker.Ctl("set_vm_memory_high_watermark", "0.4") })
	close(alarmOn)
	alarmAt := time.Now()
	time.Sleep(15 * time.Second) // the disruption's length, not a wait for a condition
	_, during, _ := r.counts()
	alarm("0.4")
	eventually.True(t, 90*time.Second, "every job to succeed", func() bool {
		n, _, _ := r.counts()
		return n == jobs
	})
	r.quiet(t)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	succeeded, executions, twice := r.counts()
	hist := map[int]int{}
	for _, a := range r.at {
		hist[int(a.Sub(alarmAt)/time.Second)]++
	}
	t.Logf("executions by second from the alarm: %v", hist)
	conn := broker.Dial(t)
	dead := depth(t, conn, "alarmed.dlq")
	blocked := strings.Count(logs.String(), "rabbitmq connection blocked")
	t.Logf("%d jobs: %d succeeded, %d executions (%d when the alarm was lifted), %d attempts run twice, %d dead-lettered, %q logged %d times",
		jobs, succeeded, executions, during, len(twice), dead, "rabbitmq connection blocked", blocked)
	if len(twice) > 0 {
		t.Errorf("attempts run more than once: %v", twice)
	}
	if succeeded != jobs || dead != 0 {
		t.Errorf("%d of %d jobs succeeded, %d dead-lettered", succeeded, jobs, dead)
	}
	if blocked != 1 || !strings.Contains(logs.String(), "rabbitmq connection unblocked") {
		t.Errorf("blocked logged %d times, want once, and unblocked once; log:\n%s", blocked, logs.String())
	}
}

// TestLargeErrorsAndHeadersKeepTheConnection: a job whose handler fails
// with a 200 KB error, a plain message with 120 KB of headers of its own
// that fails once, and 100 short jobs. The error is truncated and the
// foreign headers dropped below frame_max: the connection is never closed
// (it was, frame_too_large, and jobs that had succeeded were dead-lettered
// as crash loops), no job runs twice, only the failing job is
// dead-lettered, with its error truncated.
func TestLargeErrorsAndHeadersKeepTheConnection(t *testing.T) {
	const short = 100
	broker := shared.Broker(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logs logbuf.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	b, err := rabbitmq.Open(ctx, broker.URL(), rabbitmq.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	q := b.Queue("framed")
	if err := q.Declare(ctx); err != nil {
		t.Fatal(err)
	}
	ids := []string{"huge"}
	for i := range short {
		ids = append(ids, fmt.Sprintf("s%05d", i))
	}
	enqueueAll(t, b, q, ids)
	ch := broker.Channel(t)
	big := amqp.Table{}
	for _, k := range []string{"a", "b", "c"} {
		big["big-"+k] = strings.Repeat(k, 40_000)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", "framed", false, false, amqp.Publishing{
		MessageId: "plain-big", Headers: big, Body: []byte("{}")})
	if err != nil || !dc.Wait() {
		t.Fatalf("publish the plain message: %v", err)
	}
	p, err := policy.Parse([]byte(workerPolicy))
	if err != nil {
		t.Fatal(err)
	}
	r := newRuns()
	handler := func(_ context.Context, j queue.Job) error {
		var err error
		switch {
		case j.ID == "huge":
			err = &backstop.Failure{HTTPStatus: 503, Err: errors.New(strings.Repeat("e", 200_000))}
		case j.ID == "plain-big" && j.Attempt == 1:
			err = &backstop.Failure{HTTPStatus: 503, Err: errors.New("503 unavailable")}
		}
		r.record(j, err == nil)
		return err
	}
	done := make(chan error, 1)
	go func() { done <- q.Work(ctx, backstop.Native(p), handler, rabbitmq.WithPrefetch(16)) }()
	conn := broker.Dial(t)
	eventually.True(t, 60*time.Second, "the short jobs and the plain one to succeed, the huge one dead-lettered", func() bool {
		n, _, _ := r.counts()
		return n == short+1 && depth(t, conn, "framed.dlq") >= 1
	})
	r.quiet(t)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	_, executions, twice := r.counts()
	var deadIDs []string
	var hugeErr string
	for {
		d, ok, err := ch.Get("framed.dlq", true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		deadIDs = append(deadIDs, d.MessageId)
		if d.MessageId == "huge" {
			hugeErr, _ = d.Headers[rabbitmq.HeaderError].(string)
		}
	}
	losses := strings.Count(logs.String(), "rabbitmq connection lost")
	t.Logf("%d executions, %d attempts run twice, dead letters %v, %d connection losses, huge error %d bytes",
		executions, len(twice), deadIDs, losses, len(hugeErr))
	if losses != 0 || len(twice) != 0 {
		t.Errorf("%d connection losses, attempts run twice: %v; log:\n%s", losses, twice, logs.String())
	}
	if len(deadIDs) != 1 || deadIDs[0] != "huge" {
		t.Errorf("dead letters %v, want only huge", deadIDs)
	}
	if len(hugeErr) > rabbitmq.MaxErrorBytes || !strings.HasSuffix(hugeErr, " …[truncated: 200000 bytes]") {
		t.Errorf("the huge job's error: %d bytes, ending %q", len(hugeErr), hugeErr[max(0, len(hugeErr)-40):])
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done["plain-big"] != 2 {
		t.Errorf("the plain message with 120 KB of headers succeeded at attempt %d, want 2", r.done["plain-big"])
	}
}
