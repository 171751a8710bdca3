package reliability

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/backstop-dev/backstop/internal/eventually"
	"github.com/backstop-dev/backstop/internal/rabbittest"
	"github.com/backstop-dev/backstop/queue/rabbitmq"
)

// TestCrashLosesNothing: 10,000 jobs (succeeding, failing once then
// succeeding, dead-lettered at once or after max attempts) through four
// worker processes that are SIGKILLed at least 20 times, while the broker
// is restarted twice. Every job ends exactly once: as a success or as a
// dead letter with the reason and attempt its fate says, never both,
// never neither; duplicate executions (the price of at-least-once) are
// counted and reported. The kills follow the progress (one per 1/40 of
// the executions expected), not the clock, so a slow machine gets as many.
func TestCrashLosesNothing(t *testing.T) {
	const jobs = 10_000
	const queueName = "crash"
	// Fresh management figures (unacked deliveries) for the end condition.
	broker := rabbittest.Start(t, rabbittest.WithConfig("collect_statistics_interval = 100"))
	ctx := context.Background()
	b, err := rabbitmq.Open(ctx, broker.URL(), rabbitmq.WithLogger(quietLog))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// Far above what the kills can cause: a job dead-lettered as a crash
	// loop would hide its real fate (the poison test checks the limit).
	q := b.Queue(queueName, rabbitmq.WithMaxDeliveries(50))
	if err := q.Declare(ctx); err != nil {
		t.Fatal(err)
	}
	var wantExec, wantSucceeded, wantDead int
	ids := make([]string, jobs)
	for i := range ids {
		ids[i] = fmt.Sprintf("j%05d", i)
		final, dead := expected(ids[i])
		wantExec += int(final)
		if dead != "" {
			wantDead++
		} else {
			wantSucceeded++
		}
	}
	enqueueAll(t, b, q, ids)

	ledger := filepath.Join(t.TempDir(), "ledger")
	f := newFleet(t, "crash", 4, "BACKSTOP_RELIABILITY_URL="+broker.URL(), "BACKSTOP_RELIABILITY_QUEUE="+queueName,
		"BACKSTOP_RELIABILITY_LEDGER="+ledger, "BACKSTOP_RELIABILITY_MAX_DELIVERIES=50",
		"BACKSTOP_RELIABILITY_PREFETCH=32", "BACKSTOP_RELIABILITY_CONCURRENCY=8")

	executions := func() int {
		st, err := os.Stat(ledger)
		if err != nil {
			return 0
		}
		return int(st.Size() / ledgerLineLen)
	}
	conn := broker.Dial(t)
	depth := func(name string) int {
		ch, err := conn.Channel()
		if err != nil {
			return -1
		}
		defer ch.Close()
		st, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
		if err != nil {
			return -1
		}
		return st.Messages
	}
	start := time.Now()
	rng := rand.New(rand.NewPCG(12, 12))
	kills, restarts := 0, 0
	step := wantExec / 40
	for next := step; next < wantExec*9/10; next += step {
		if err := eventually.Wait(90*time.Second, func() bool { f.revive(); return executions() >= next }); err != nil {
			t.Fatalf("stalled at %d of %d executions after %d kills, %d broker restarts", executions(), wantExec, kills, restarts)
		}
		f.kill(rng.IntN(len(f.procs)))
		kills++
		if restarts < 2 && next >= wantExec*(restarts+1)/3 {
			broker.Restart(t)
			restarts++
			conn.Close()
			conn = broker.Dial(t)
		}
	}
	// Drained: every job executed at its final attempt, as many dead
	// letters as fates say, nothing ready or unacked in the queue, nothing
	// in the delay.
	var got ledgerSummary
	eventually.True(t, 90*time.Second, "every job to reach its end", func() bool {
		f.revive()
		got = readLedger(t, ledger)
		if got.final < jobs || depth(queueName+".dlq") < wantDead || depth(queueName) != 0 {
			return false
		}
		for n := range 18 {
			if depth("backstop.delay.L"+strconv.Itoa(n)) != 0 {
				return false
			}
		}
		return unacked(t, broker, queueName) == 0
	})
	f.stop()
	elapsed := time.Since(start)

	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	dead := map[string]int{}
	byReason := map[string]int{}
	for {
		d, ok, err := ch.Get(queueName+".dlq", true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		id := d.MessageId
		dead[id]++
		reason := fmt.Sprint(d.Headers[rabbitmq.HeaderReason])
		byReason[reason]++
		final, want := expected(id)
		if reason != want || fmt.Sprint(d.Headers[rabbitmq.HeaderAttempt]) != strconv.FormatInt(final, 10) {
			t.Errorf("job %s dead-lettered with %s at attempt %v, want %q at %d", id, reason, d.Headers[rabbitmq.HeaderAttempt], want, final)
		}
	}
	got = readLedger(t, ledger)
	deadDups := 0
	for _, id := range ids {
		final, reason := expected(id)
		okAt, succeeded := got.succeeded[id]
		n := dead[id]
		switch {
		case succeeded && n > 0:
			t.Errorf("job %s both succeeded and dead-lettered", id)
		case !succeeded && n == 0:
			t.Errorf("job %s lost: neither succeeded nor dead-lettered", id)
		case succeeded && (reason != "" || okAt != final):
			t.Errorf("job %s succeeded at attempt %d, want %q at attempt %d", id, okAt, reason, final)
		}
		if n > 1 {
			deadDups += n - 1
		}
	}
	for _, name := range []string{queueName, queueName + ".dlq"} {
		if n := depth(name); n != 0 {
			t.Errorf("%s holds %d messages after the run", name, n)
		}
	}
	for n := range 18 {
		if d := depth("backstop.delay.L" + strconv.Itoa(n)); d != 0 {
			t.Errorf("delay level %d holds %d messages after the run", n, d)
		}
	}
	// The counters equal the outcomes: what the DLQ holds by reason is what
	// the jobs' fates say, plus the duplicates counted.
	wantByReason := map[string]int{}
	for _, id := range ids {
		if _, r := expected(id); r != "" {
			wantByReason[r]++
		}
	}
	for r, n := range wantByReason {
		if byReason[r] < n {
			t.Errorf("the DLQ holds %d dead letters with reason %s, want %d (plus duplicates)", byReason[r], r, n)
		}
	}
	if kills < 20 || restarts < 2 {
		t.Errorf("%d kills and %d broker restarts, want at least 20 and 2", kills, restarts)
	}
	t.Logf("%d jobs in %v: %d succeeded, %d dead-lettered %v; %d worker kills (%d worker starts), %d broker restarts; "+
		"%d executions for %d needed: %d duplicate executions (%.2f%%), %d duplicate dead letters",
		jobs, elapsed.Round(time.Millisecond), len(got.succeeded), len(dead), byReason, kills, f.starts, restarts,
		got.executions, wantExec, got.executions-got.distinct, 100*float64(got.executions-got.distinct)/float64(got.executions), deadDups)
}

type ledgerSummary struct {
	succeeded  map[string]int64 // job id → attempt that succeeded
	final      int              // jobs executed at their final attempt
	executions int
	distinct   int // distinct (job, attempt) executions
}

func readLedger(t *testing.T, path string) ledgerSummary {
	data, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	s := ledgerSummary{succeeded: map[string]int64{}}
	seen := map[string]bool{}
	for line := range bytes.Lines(data) {
		if len(line) != ledgerLineLen {
			t.Fatalf("ledger line %q: torn", line)
		}
		s.executions++
		key := string(line[:8])
		if !seen[key] {
			seen[key] = true
			s.distinct++
			if final, _ := expected(string(bytes.TrimSpace(line[:6]))); int64(line[7]-'0') == final {
				s.final++
			}
		}
		if line[9] == 'S' {
			s.succeeded[string(bytes.TrimSpace(line[:6]))] = int64(line[7] - '0')
		}
	}
	return s
}

// enqueueAll enqueues the jobs with Enqueue from a few goroutines.
func enqueueAll(t *testing.T, b *rabbitmq.Broker, q *rabbitmq.Queue, ids []string) {
	t.Helper()
	ctx := context.Background()
	const writers = 8
	errs := make(chan error, writers)
	for w := range writers {
		go func() {
			for i := w; i < len(ids); i += writers {
				if err := q.Enqueue(ctx, ids[i], []byte(`{"job":"`+ids[i]+`"}`)); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range writers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// unacked is the queue's count of unacked deliveries (management API).
func unacked(t *testing.T, broker *rabbittest.Broker, name string) int {
	req, _ := http.NewRequest(http.MethodGet, broker.ManagementURL()+"/api/queues/%2F/"+name, nil)
	req.SetBasicAuth("guest", "guest")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var info struct {
		Unacked *int `json:"messages_unacknowledged"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&info) != nil || info.Unacked == nil {
		return -1
	}
	return *info.Unacked
}
