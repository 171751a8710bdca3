// Package queuetest is the conformance suite of a queue.Broker: one run
// of the whole workflow (enqueue, work with a failing handler, the delayed
// retry, the dead letter with its reason, the outcome hook, inspect, replay,
// discard with its audit, force run, the counters) and its error paths, against a real
// server. Each broker's test package runs it:
//
//	func TestConformance(t *testing.T) {
//		queuetest.Run(t, func(t *testing.T) queuetest.Target {
//			return queuetest.Target{Broker: redisqueue.NewBroker(client), Features: …, Audit: …}
//		})
//	}
//
// A broker that cannot do something (Features) must say so with an error
// that wraps queue.ErrUnsupported and names the broker.
package queuetest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/queue"
)

// Features says what a broker can do beyond what every broker must.
type Features struct {
	// Run: queue.Queue.Run moves a delayed job by id and by due time.
	Run bool
	// Counters: Stats.Counters holds the broker's counters (Redis' stats
	// hash: enqueued, attempts:*, dead_letters:<reason>, replayed,
	// discarded); without it Counters is nil.
	Counters bool
	// Delayed: Stats.Delayed counts the queue's delayed jobs.
	Delayed bool
	// MissingIsError: the operations of a queue that was never made fail
	// (RabbitMQ); without it such a queue reads as empty, Stats.Found false.
	MissingIsError bool
}

// AuditRecord is one discarded dead letter as the broker's audit keeps it.
type AuditRecord struct {
	Action, Note, Actor, JobID string
}

// Target is a broker under test.
type Target struct {
	// Broker is the broker, its workers tuned for a test (a delayed job
	// promoted within a second or so); the suite closes it.
	Broker   queue.Broker
	Features Features
	// Audit reads the audit of a queue (names.Audit) with the broker's own
	// client: what the interface does not read.
	Audit func(ctx context.Context, names queue.Names) ([]AuditRecord, error)
}

// Factory makes the Target of one run; it may fail t.
type Factory func(t *testing.T) Target

// wait bounds every wait of the suite: a hang, never what is asserted.
const wait = 30 * time.Second

// Run runs the suite against the broker f makes.
func Run(t *testing.T, f Factory) {
	tg := f(t)
	t.Cleanup(func() { tg.Broker.Close() })
	s := &suite{t: t, tg: tg, prefix: "conformance-" + strconv.FormatUint(rand.Uint64()%1e8, 10) + "-"}
	t.Run("Names", s.names)
	t.Run("Workflow", s.workflow)
	t.Run("Run", s.run)
	t.Run("Page", s.page)
	t.Run("Errors", s.errors)
}

type suite struct {
	t      *testing.T
	tg     Target
	prefix string
}

func (s *suite) open(t *testing.T, name string) queue.Queue {
	t.Helper()
	q, err := s.tg.Broker.Open(s.prefix + name)
	if err != nil {
		t.Fatalf("open %s: %v", name, err)
	}
	if q.Name() != s.prefix+name {
		t.Fatalf("Name() = %q, want %q", q.Name(), s.prefix+name)
	}
	return q
}

// names: every part a queue has is named, no two alike, and two queues
// share none.
func (s *suite) names(t *testing.T) {
	a, b := s.open(t, "names-a").Names(), s.open(t, "names-b").Names()
	parts := func(n queue.Names) []string { return []string{n.Jobs, n.Delayed, n.DLQ, n.Stats, n.Audit} }
	for i, p := range parts(a) {
		if p != "" && slices.Contains(parts(b), p) {
			t.Errorf("queues names-a and names-b share the name %q", p)
		}
		if p != "" && slices.Contains(parts(a)[i+1:], p) {
			t.Errorf("two parts of names-a are both named %q: %+v", p, a)
		}
	}
	if a.Jobs == "" || a.DLQ == "" || a.Audit == "" {
		t.Errorf("names-a: jobs, dlq and audit must be named: %+v", a)
	}
	if (a.Stats != "") != s.tg.Features.Counters {
		t.Errorf("names-a: a stats part (%q) goes with Features.Counters (%v)", a.Stats, s.tg.Features.Counters)
	}
}

// A policy of two attempts, the retry a second later: the shortest delay
// every broker keeps (RabbitMQ counts whole seconds).
const twoAttempts = `{"max_attempts": 2, "backoff": {"strategy": "constant", "base": "1s", "cap": "1s"}, "jitter": {"mode": "none"}}`

func decider(t *testing.T, js string) backstop.Decider {
	t.Helper()
	p, err := policy.Parse([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	return backstop.Native(p)
}

// seen is what the handler saw of one attempt.
type seen struct {
	Attempt               int64
	Type, Payload         string
	LastError, LastReason string
}

// jobs is a handler whose behaviour each job's payload names, and the
// record of what it ran.
type jobs struct {
	mu    sync.Mutex
	runs  map[string][]seen
	fixed bool // "fixed-later" succeeds from now on
}

func newJobs() *jobs { return &jobs{runs: map[string][]seen{}} }

func (j *jobs) handle(_ context.Context, job queue.Job) error {
	j.mu.Lock()
	j.runs[job.ID] = append(j.runs[job.ID], seen{Attempt: job.Attempt, Type: job.Type, Payload: string(job.Payload),
		LastError: job.LastError, LastReason: job.LastReason})
	fixed := j.fixed
	j.mu.Unlock()
	switch string(job.Payload) {
	case "ok":
		return nil
	case "permanent":
		return &backstop.Failure{HTTPStatus: 400, Err: errors.New("card declined")}
	case "fixed-later":
		if fixed {
			return nil
		}
	}
	return &backstop.Failure{HTTPStatus: 503, Err: errors.New("upstream answered 503")}
}

func (j *jobs) of(id string) []seen {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.runs[id])
}

func (j *jobs) fix() {
	j.mu.Lock()
	j.fixed = true
	j.mu.Unlock()
}

// work runs q's worker until the returned stop, which checks that Work
// returned nil.
func work(t *testing.T, q queue.Queue, p backstop.Decider, h queue.Handler) (stop func()) {
	t.Helper()
	return workHooked(t, q, p, h, nil)
}

// workHooked is work with an outcome hook (WorkOptions.OnOutcome).
func workHooked(t *testing.T, q queue.Queue, p backstop.Decider, h queue.Handler, hook queue.OutcomeHook) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- q.Work(ctx, p, h, queue.WorkOptions{Concurrency: 2, HandlerTimeout: 10 * time.Second,
			Logger: slog.New(slog.DiscardHandler), OnOutcome: hook})
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("queue %s: Work returned %v, want nil once its ctx is done", q.Name(), err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func stats(t *testing.T, q queue.Queue) queue.Stats {
	t.Helper()
	st, err := q.Stats(context.Background())
	if err != nil {
		t.Fatalf("queue %s: stats: %v", q.Name(), err)
	}
	return st
}

func enqueue(t *testing.T, q queue.Queue, id, payload, jobType string) {
	t.Helper()
	if _, err := q.Enqueue(context.Background(), id, []byte(payload), queue.EnqueueOptions{Type: jobType}); err != nil {
		t.Fatalf("queue %s: enqueue %s: %v", q.Name(), id, err)
	}
}

// counts checks that q comes to hold jobs jobs and dead dead letters. A
// broker's figures may lag a move a moment (RabbitMQ counts a dead letter
// a replay or an inspect looked at and gave back once it is back): the
// suite waits for them, and reports the last it read.
func counts(t *testing.T, q queue.Queue, jobs, dead int64) {
	t.Helper()
	var st queue.Stats
	if eventually.Wait(wait, func() bool {
		st = stats(t, q)
		return st.Jobs == jobs && st.DeadLetters == dead
	}) != nil {
		t.Errorf("queue %s: %d jobs, %d dead letters; want %d, %d", q.Name(), st.Jobs, st.DeadLetters, jobs, dead)
	}
}

// inspect inspects q once its DLQ reports size dead letters (see counts).
func inspect(t *testing.T, q queue.Queue, o queue.InspectOptions, size int64) queue.DLQReport {
	t.Helper()
	var rep queue.DLQReport
	var err error
	if eventually.Wait(wait, func() bool {
		rep, err = q.Inspect(context.Background(), o)
		return err == nil && rep.Size == size
	}) != nil {
		t.Fatalf("queue %s: inspect %+v: size %d, %v; want %d", q.Name(), o, rep.Size, err, size)
	}
	return rep
}

// settled waits until q holds no job and dead dead letters.
func settled(t *testing.T, q queue.Queue, dead int64) queue.Stats {
	t.Helper()
	var st queue.Stats
	eventually.True(t, wait, fmt.Sprintf("queue %s: no job left and %d dead letters", q.Name(), dead), func() bool {
		st = stats(t, q)
		return st.Jobs == 0 && st.DeadLetters == dead && (st.Delayed == nil || *st.Delayed == 0)
	})
	return st
}

// workflow: a job that succeeds, one that fails for good, two that fail
// until their attempts run out (through the delayed retry), on queue a;
// one more dead letter on queue b. Then inspect, replay (to a only),
// discard (recorded in the audit), and the counters.
func (s *suite) workflow(t *testing.T) {
	ctx := context.Background()
	a, b := s.open(t, "work-a"), s.open(t, "work-b")
	h := newJobs()
	p := decider(t, twoAttempts)
	enqueue(t, a, "ok-1", "ok", "")
	enqueue(t, a, "perm-1", "permanent", "charge_card")
	enqueue(t, a, "flaky-1", "fixed-later", "send_email")
	enqueue(t, a, "flaky-2", "fixed-later", "")
	enqueue(t, b, "perm-b", "permanent", "")
	var (
		mu     sync.Mutex
		events []queue.OutcomeEvent
	)
	hook := func(_ context.Context, e queue.OutcomeEvent) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}
	stopA, stopB := workHooked(t, a, p, h.handle, hook), work(t, b, p, h.handle)
	if st := settled(t, a, 3); !st.Found {
		t.Errorf("queue %s: Found false once it held jobs", a.Name())
	}
	settled(t, b, 1)
	stopA()
	stopB()

	// Issue 45: the outcome hook was told of each applied outcome of
	// queue a, with the fields of Node's onOutcome.
	type told struct {
		Action        queue.Action
		Reason, Class string
		Attempt       int64
		Type          string
		Delay         time.Duration
		Error, Queue  string
	}
	wantTold := map[string][]told{
		"ok-1":    {{queue.Ack, "success", "", 1, "", 0, "", a.Name()}},
		"perm-1":  {{queue.DeadLetter, "permanent_error", "permanent", 1, "charge_card", 0, "card declined", a.Name()}},
		"flaky-1": {{queue.Retry, "transient", "retryable", 1, "send_email", time.Second, "upstream answered 503", a.Name()}, {queue.DeadLetter, "max_attempts_reached", "retryable", 2, "send_email", 0, "upstream answered 503", a.Name()}},
		"flaky-2": {{queue.Retry, "transient", "retryable", 1, "", time.Second, "upstream answered 503", a.Name()}, {queue.DeadLetter, "max_attempts_reached", "retryable", 2, "", 0, "upstream answered 503", a.Name()}},
	}
	mu.Lock()
	gotTold := map[string][]told{}
	for _, e := range events {
		gotTold[e.Job.ID] = append(gotTold[e.Job.ID], told{e.Action, e.Reason, e.Class, e.Job.Attempt, e.Job.Type, e.Delay, e.Error, e.Queue})
	}
	mu.Unlock()
	for id, w := range wantTold {
		g := gotTold[id]
		ok := len(g) == len(w)
		for i := 0; ok && i < len(w); i++ {
			ok = g[i].Action == w[i].Action && g[i].Reason == w[i].Reason && g[i].Class == w[i].Class && g[i].Attempt == w[i].Attempt &&
				g[i].Type == w[i].Type && g[i].Delay == w[i].Delay && strings.Contains(g[i].Error, w[i].Error) && g[i].Queue == w[i].Queue
		}
		if !ok {
			t.Errorf("outcome hook told of job %s: %+v; want %+v", id, g, w)
		}
	}
	if len(gotTold) != len(wantTold) {
		t.Errorf("outcome hook told of %d jobs, want %d (queue b has no hook): %v", len(gotTold), len(wantTold), gotTold)
	}

	// The delayed retry: attempt 2 ran with attempt 1's error and reason.
	for _, id := range []string{"flaky-1", "flaky-2"} {
		runs := h.of(id)
		if len(runs) != 2 || runs[0].Attempt != 1 || runs[1].Attempt != 2 {
			t.Fatalf("job %s ran %+v, want attempts 1 then 2", id, runs)
		}
		if r := runs[1]; r.LastReason != "transient" || !strings.Contains(r.LastError, "503") || r.Payload != "fixed-later" {
			t.Errorf("job %s's attempt 2 saw %+v, want attempt 1's error (503), reason transient and the payload", id, r)
		}
	}
	if runs := h.of("flaky-1"); runs[1].Type != "send_email" {
		t.Errorf("job flaky-1's type after the retry = %q, want send_email", runs[1].Type)
	}
	if runs := h.of("ok-1"); len(runs) != 1 {
		t.Errorf("job ok-1 ran %d times, want 1", len(runs))
	}

	// Inspect shows each dead letter with its reason, attempt and error.
	rep := inspect(t, a, queue.InspectOptions{Letters: 10, Scan: queue.ScanDefault}, 3)
	if rep.Size != 3 || rep.Scanned != 3 || rep.ByReason["max_attempts_reached"] != 2 || rep.ByReason["permanent_error"] != 1 || len(rep.ByReason) != 2 {
		t.Fatalf("inspect: size %d, scanned %d, by reason %v; want 3, 3, 2 max_attempts_reached and 1 permanent_error", rep.Size, rep.Scanned, rep.ByReason)
	}
	if got := rep.Reasons(); !slices.Equal(got, []string{"max_attempts_reached", "permanent_error"}) {
		t.Errorf("Reasons() = %v, most frequent first", got)
	}
	want := map[string]queue.DLQEntry{
		"perm-1":  {JobID: "perm-1", Type: "charge_card", Attempt: "1", Reason: "permanent_error", Error: "card declined"},
		"flaky-1": {JobID: "flaky-1", Type: "send_email", Attempt: "2", Reason: "max_attempts_reached", Error: "upstream answered 503"},
		"flaky-2": {JobID: "flaky-2", Attempt: "2", Reason: "max_attempts_reached", Error: "upstream answered 503"},
	}
	if len(rep.Letters) != 3 {
		t.Fatalf("inspect listed %d dead letters, want 3: %+v", len(rep.Letters), rep.Letters)
	}
	for _, d := range rep.Letters {
		w, ok := want[d.JobID]
		d.EntryID = ""
		if !ok || !strings.Contains(d.Error, w.Error) || (d.Type != w.Type || d.Attempt != w.Attempt || d.Reason != w.Reason) {
			t.Errorf("inspect lists %+v, want %+v", d, w)
		}
	}
	if one := inspect(t, a, queue.InspectOptions{Letters: 1, Scan: 2}, 3); len(one.Letters) != 1 || one.Scanned != 2 {
		t.Errorf("inspect of 1, scan 2: %d letters, scanned %d; want 1, 2", len(one.Letters), one.Scanned)
	}

	// Replay --limit 1 moves one of the two, to queue a only.
	n, err := a.Replay(ctx, queue.ReplayOptions{Limit: 1, Reason: "max_attempts_reached"})
	if err != nil || n != 1 {
		t.Fatalf("replay limit 1: %d, %v; want 1", n, err)
	}
	counts(t, a, 1, 2)
	counts(t, b, 0, 1) // untouched
	// The replayed job starts afresh, and now succeeds.
	h.fix()
	stopA = work(t, a, p, h.handle)
	eventually.True(t, wait, "the replayed job ran", func() bool { return len(h.of("flaky-1"))+len(h.of("flaky-2")) == 5 })
	stopA() // applies the outcome of a job in hand
	settled(t, a, 2)
	replayed := ""
	for _, id := range []string{"flaky-1", "flaky-2"} {
		if runs := h.of(id); len(runs) == 3 {
			replayed = id
			if runs[2].Attempt != 1 {
				t.Errorf("replayed job %s ran at attempt %d, want 1 (reset)", id, runs[2].Attempt)
			}
		}
	}
	if replayed == "" {
		t.Fatalf("no replayed job ran: %+v %+v", h.of("flaky-1"), h.of("flaky-2"))
	}

	// Discard: a purge by reason and a delete by id, each recorded with
	// its note in the audit; a discard refused before the broker moves
	// nothing.
	if _, err := a.Discard(ctx, queue.DiscardOptions{Action: queue.DiscardPurge, Actor: "queuetest"}); err == nil {
		t.Error("a discard without a note: no error")
	}
	if _, err := a.Discard(ctx, queue.DiscardOptions{Action: queue.DiscardDelete, Note: "why", Actor: "queuetest"}); err == nil {
		t.Error("a delete without a job id: no error")
	}
	n, err = a.Discard(ctx, queue.DiscardOptions{Action: queue.DiscardPurge, Reason: "permanent_error", Note: "card declined for good", Actor: "queuetest@host"})
	if err != nil || n != 1 {
		t.Fatalf("purge permanent_error: %d, %v; want 1", n, err)
	}
	left := "flaky-1"
	if replayed == left {
		left = "flaky-2"
	}
	n, err = a.Discard(ctx, queue.DiscardOptions{Action: queue.DiscardDelete, ID: left, Note: "duplicate", Actor: "queuetest@host"})
	if err != nil || n != 1 {
		t.Fatalf("delete %s: %d, %v; want 1", left, n, err)
	}
	counts(t, a, 0, 0)
	audit, err := s.tg.Audit(ctx, a.Names())
	if err != nil {
		t.Fatal(err)
	}
	wantAudit := []AuditRecord{
		{Action: "purge", Note: "card declined for good", Actor: "queuetest@host", JobID: "perm-1"},
		{Action: "delete", Note: "duplicate", Actor: "queuetest@host", JobID: left},
	}
	if !slices.Equal(audit, wantAudit) {
		t.Errorf("audit of %s = %+v, want %+v", a.Names().Audit, audit, wantAudit)
	}

	// The counters agree with what happened.
	st := stats(t, a)
	if !s.tg.Features.Counters {
		if st.Counters != nil {
			t.Errorf("a broker without counters reports %v", st.Counters)
		}
		return
	}
	wantCounters := map[string]int64{
		"enqueued": 4, "attempts:success": 2, "attempts:retry": 2, "attempts:dead_letter": 3,
		"dead_letters:permanent_error": 1, "dead_letters:max_attempts_reached": 2, "max_attempts_reached": 2,
		"retries:transient": 2, "replayed": 1, "discarded": 2,
	}
	for k, v := range wantCounters {
		if st.Counters[k] != v {
			t.Errorf("counter %s = %d, want %d (counters: %v)", k, st.Counters[k], v, st.Counters)
		}
	}
}

// run: a job delayed an hour runs now by id, then by due time; a broker
// without it says so.
func (s *suite) run(t *testing.T) {
	ctx := context.Background()
	q := s.open(t, "run")
	if !s.tg.Features.Run {
		_, err := q.Run(ctx, queue.RunOptions{ID: "any"})
		if !errors.Is(err, queue.ErrUnsupported) || !strings.Contains(err.Error(), s.tg.Broker.Kind()) || !strings.Contains(err.Error(), q.Name()) {
			t.Errorf("run on a broker without it: %v; want queue.ErrUnsupported naming the broker %s and the queue", err, s.tg.Broker.Kind())
		}
		return
	}
	h := newJobs()
	p := decider(t, `{"max_attempts": 5, "backoff": {"strategy": "constant", "base": "1h", "cap": "1h"}, "jitter": {"mode": "none"}}`)
	enqueue(t, q, "later-1", "fixed-later", "")
	enqueue(t, q, "later-2", "fixed-later", "")
	stop := work(t, q, p, h.handle)
	if s.tg.Features.Delayed {
		eventually.True(t, wait, "both jobs delayed", func() bool {
			st := stats(t, q)
			return st.Delayed != nil && *st.Delayed == 2 && st.Jobs == 0
		})
	} else {
		eventually.True(t, wait, "both jobs ran once", func() bool {
			return len(h.of("later-1")) == 1 && len(h.of("later-2")) == 1 && stats(t, q).Jobs == 0
		})
	}
	h.fix()
	if r, err := q.Run(ctx, queue.RunOptions{ID: "nobody"}); err != nil || r.Moved != 0 {
		t.Errorf("run an id not delayed: %+v, %v; want nothing moved, no error", r, err)
	}
	// A broker that cannot count its delayed jobs cannot say when the
	// retry is delayed (published and confirmed, the failed run acked):
	// the run is tried until it finds it, once.
	runOnce := func(what string, o queue.RunOptions, wantLeft int) {
		t.Helper()
		var r queue.RunResult
		var err error
		eventually.True(t, wait, what, func() bool {
			r, err = q.Run(ctx, o)
			return err != nil || r.Moved != 0 || s.tg.Features.Delayed
		})
		if err != nil || r.Moved != 1 || r.Left != wantLeft {
			t.Fatalf("%s: %+v, %v; want 1 moved, %d left", what, r, err, wantLeft)
		}
	}
	runOnce("run later-1", queue.RunOptions{ID: "later-1"}, 0)
	eventually.True(t, wait, "later-1 ran again", func() bool { return len(h.of("later-1")) == 2 })
	runOnce("run due before +2h", queue.RunOptions{DueBefore: time.Now().Add(2 * time.Hour), Limit: 10}, 0)
	settled(t, q, 0)
	stop()
	for _, id := range []string{"later-1", "later-2"} {
		if runs := h.of(id); len(runs) != 2 || runs[1].Attempt != 2 {
			t.Errorf("job %s ran %+v, want attempt 2 after the run", id, runs)
		}
	}
}

// errors: what the broker refuses, and a queue that was never made. Every
// error names the queue.
func (s *suite) errors(t *testing.T) {
	ctx := context.Background()
	if _, err := s.tg.Broker.Open(""); err == nil {
		t.Error("open \"\": no error")
	}
	q := s.open(t, "errors")
	p := decider(t, twoAttempts)
	named := func(what string, q queue.Queue, err error) {
		t.Helper()
		if err == nil {
			t.Errorf("%s: no error", what)
		} else if !strings.Contains(err.Error(), q.Name()) {
			t.Errorf("%s: %v; the error does not name queue %s", what, err, q.Name())
		}
	}
	_, err := q.Enqueue(ctx, "bad-type", nil, queue.EnqueueOptions{Type: "no spaces"})
	named("enqueue with an invalid job type", q, err)
	_, err = q.Replay(ctx, queue.ReplayOptions{Limit: 0})
	named("replay without a limit or an id", q, err)
	_, err = q.Replay(ctx, queue.ReplayOptions{Limit: 1, Rate: -1})
	named("replay at a negative rate", q, err)
	_, err = q.Discard(ctx, queue.DiscardOptions{Action: "shred", Note: "why", Actor: "queuetest"})
	named("discard with an unknown action", q, err)
	_, err = q.Inspect(ctx, queue.InspectOptions{Letters: -1})
	named("inspect -1 letters", q, err)
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	named("work at concurrency -1", q, q.Work(wctx, p, newJobs().handle, queue.WorkOptions{Concurrency: -1}))

	// A queue nobody made: an error naming it, or an empty queue that says
	// it was not found.
	missing := s.open(t, "never-made")
	st, err := missing.Stats(ctx)
	if s.tg.Features.MissingIsError {
		named("stats of a queue never made", missing, err)
		_, err = missing.Replay(ctx, queue.ReplayOptions{Limit: 1})
		named("replay of a queue never made", missing, err)
	} else if err != nil || st.Found || st.Jobs != 0 || st.DeadLetters != 0 {
		t.Errorf("stats of a queue never made: %+v, %v; want an empty queue, not found", st, err)
	}
}

// page: a DLQ of 7 dead letters read a page at a time, by cursor, filter,
// scan bound and preview; looking moves nothing.
func (s *suite) page(t *testing.T) {
	ctx := context.Background()
	q := s.open(t, "page")
	h := newJobs()
	stop := work(t, q, decider(t, twoAttempts), h.handle)
	before := time.Now().Add(-time.Second)
	for i := range 7 {
		enqueue(t, q, fmt.Sprintf("p-%d", i), "permanent", []string{"email", "sms"}[i%2])
	}
	settled(t, q, 7)
	stop()
	pg := func(o queue.PageOptions) queue.DLQPage {
		t.Helper()
		p, err := q.Page(ctx, o)
		if err != nil {
			t.Fatalf("queue %s: page %+v: %v", q.Name(), o, err)
		}
		return p
	}
	var ids []string
	cursor, pages := "", 0
	for {
		p := pg(queue.PageOptions{Cursor: cursor, Limit: 3})
		pages++
		if len(p.Letters) > 3 || p.Scanned > 4 {
			t.Fatalf("page of limit 3: %d letters, %d scanned", len(p.Letters), p.Scanned)
		}
		for _, l := range p.Letters {
			ids = append(ids, l.JobID)
			if l.Reason == "" || string(l.Payload) != "permanent" || l.PayloadSize != 9 || len(l.Fields) == 0 {
				t.Errorf("letter %+v: want a reason, payload \"permanent\" (9 bytes), a cursor, fields", l)
			}
			if l.DeadLettered.Before(before) || l.DeadLettered.After(time.Now().Add(time.Second)) {
				t.Errorf("letter %s: dead-lettered at %v, want since %v", l.JobID, l.DeadLettered, before)
			}
		}
		if p.Next == "" || pages > 5 {
			break
		}
		cursor = p.Next
	}
	slices.Sort(ids)
	if want := []string{"p-0", "p-1", "p-2", "p-3", "p-4", "p-5", "p-6"}; !slices.Equal(ids, want) {
		t.Errorf("the pages read %v in %d pages, want each of %v once", ids, pages, want)
	}
	sms := pg(queue.PageOptions{Limit: 10, JobType: "sms"})
	if len(sms.Letters) != 3 {
		t.Errorf("job type sms: %d letters, want 3", len(sms.Letters))
	}
	for _, l := range sms.Letters {
		if l.Type != "sms" {
			t.Errorf("job type sms: got %s of type %q", l.JobID, l.Type)
		}
	}
	one := pg(queue.PageOptions{Limit: 10, ID: "p-4"})
	if len(one.Letters) != 1 || one.Letters[0].JobID != "p-4" || one.Letters[0].Type != "email" {
		t.Fatalf("job id p-4: %+v", one.Letters)
	}
	if c := one.Letters[0].Cursor; c != "" { // a broker that can start at one dead letter
		at := pg(queue.PageOptions{Cursor: c, Limit: 1})
		if len(at.Letters) != 1 || at.Letters[0].JobID != "p-4" {
			t.Errorf("page at p-4's cursor: %+v, want p-4 first", at.Letters)
		}
	}
	bounded := pg(queue.PageOptions{Limit: 1, Scan: 2, ID: "nobody"})
	if len(bounded.Letters) != 0 || bounded.Scanned != 2 || bounded.Next == "" {
		t.Errorf("scan 2 for a missing id: %d letters, %d scanned, next %q; want 0, 2, a next page", len(bounded.Letters), bounded.Scanned, bounded.Next)
	}
	if p := pg(queue.PageOptions{Limit: 10, Since: time.Now().Add(time.Hour)}); len(p.Letters) != 0 {
		t.Errorf("since an hour ahead: %d letters, want none", len(p.Letters))
	}
	if p := pg(queue.PageOptions{Limit: 10, Until: before}); len(p.Letters) != 0 {
		t.Errorf("until before the test: %d letters, want none", len(p.Letters))
	}
	if p := pg(queue.PageOptions{Limit: 10, Since: before, Until: time.Now().Add(time.Hour)}); len(p.Letters) != 7 {
		t.Errorf("since the test's start: %d letters, want 7", len(p.Letters))
	}
	if p := pg(queue.PageOptions{Limit: 1, Preview: 4}); len(p.Letters) != 1 || string(p.Letters[0].Payload) != "perm" || p.Letters[0].PayloadSize != 9 {
		t.Errorf("preview 4: %+v, want \"perm\" of 9 bytes", p.Letters)
	}
	for _, o := range []queue.PageOptions{{Limit: 0}, {Limit: queue.MaxPageLimit + 1}, {Limit: 5, Scan: 4}, {Limit: 1, Cursor: "not a cursor"}} {
		if _, err := q.Page(ctx, o); err == nil || !strings.Contains(err.Error(), q.Name()) {
			t.Errorf("page %+v: err %v, want one naming the queue", o, err)
		}
	}
	counts(t, q, 0, 7)
	// The audit reads back what a discard recorded, newest first.
	if recs, err := q.Audit(ctx, 10); err != nil || len(recs) != 0 {
		t.Errorf("audit before any discard: %+v, %v; want none", recs, err)
	}
	for _, id := range []string{"p-1", "p-2"} {
		if n, err := q.Discard(ctx, queue.DiscardOptions{Action: queue.DiscardDelete, ID: id, Note: "bad card " + id, Actor: "ops@console"}); n != 1 || err != nil {
			t.Fatalf("delete %s: %d, %v", id, n, err)
		}
	}
	recs, err := q.Audit(ctx, 1)
	if err != nil || len(recs) != 1 {
		t.Fatalf("audit, limit 1: %+v, %v; want one record", recs, err)
	}
	if r := recs[0]; r.Action != queue.DiscardDelete || r.Note != "bad card p-2" || r.Actor != "ops@console" || r.JobID != "p-2" ||
		r.Reason == "" || r.At.Before(before) {
		t.Errorf("the newest audit record: %+v, want p-2's delete by ops@console", r)
	}
	if recs, err := q.Audit(ctx, 10); err != nil || len(recs) != 2 || recs[1].JobID != "p-1" {
		t.Errorf("audit, limit 10: %+v, %v; want p-2's record then p-1's", recs, err)
	}
	if _, err := q.Audit(ctx, 0); err == nil {
		t.Errorf("audit, limit 0: no error")
	}
}
