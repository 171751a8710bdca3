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
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/internal/testing/rabbittest"
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
	// Fresh management figures (unacked deliveries) for the end condition.
	broker := rabbittest.Start(t, rabbittest.WithConfig("collect_statistics_interval = 100"))
	runCrash(t, crashSetup{
		jobs:     10_000,
		urls:     []string{broker.URL()},
		observer: broker,
		disrupt:  func(t *testing.T, _ crashRun) string { broker.Restart(t); return "broker restart" },
	})
}

// TestClusterCrashLosesNothing: the crash test on a 3-node cluster whose
// queues' leader node (the first: the test declares the queues through it)
// is killed and started again twice, while the worker processes, spread
// over the nodes and failing over to the others, are SIGKILLed as in
// TestCrashLosesNothing. Quorum queues keep every job.
func TestClusterCrashLosesNothing(t *testing.T) {
	c := rabbittest.StartCluster(t, 3, rabbittest.WithConfig("collect_statistics_interval = 100"))
	runCrash(t, crashSetup{
		jobs:     6_000,
		urls:     c.URLs(),
		observer: c.Nodes[1],
		disrupt: func(t *testing.T, r crashRun) string {
			c.Nodes[0].Kill()
			// The jobs go on without the node (unless none is left): the
			// workers that were on it fail over, and the queues elect
			// leaders on the others. A worker that exits meanwhile is
			// started again, as its supervisor would.
			from := r.executions()
			if err := eventually.Wait(90*time.Second, func() bool { r.revive(); return r.executions() >= from+200 || r.finished() }); err != nil {
				t.Fatalf("no progress with node 1 down: %d executions, then %d in 90 s\n%s", from, r.executions()-from, r.where())
			}
			c.Nodes[0].KillAndRestart(t)
			return "leader node killed and restarted"
		},
	})
}

// TestCrashLosesNothingWithJavaWorkers: the crash test with two Java
// worker processes (sdk/java RabbitCrashWorker: a RabbitWorker with the Go
// workers' policy and handler, writing the same ledger) beside two Go ones,
// all SIGKILLed at random while the broker is restarted twice. Fewer jobs
// than the Go-only run: it is about the mixed fleet. The Java build must
// be there: a missing java or mvn fails the test.
func TestCrashLosesNothingWithJavaWorkers(t *testing.T) {
	broker := rabbittest.Start(t, rabbittest.WithConfig("collect_statistics_interval = 100"))
	runCrash(t, crashSetup{
		jobs:     2_000,
		java:     2,
		urls:     []string{broker.URL()},
		observer: broker,
		disrupt:  func(t *testing.T, _ crashRun) string { broker.Restart(t); return "broker restart" },
	})
}

// crashSetup is a crash test's broker: the nodes' URLs (worker i connects
// to urls[i % len] first, failing over to the others), a node that stays
// up for the test's own looks, and the disruption made twice; java of the
// four workers are Java processes.
type crashSetup struct {
	jobs     int
	java     int
	urls     []string
	observer *rabbittest.Broker
	disrupt  func(t *testing.T, r crashRun) string // what it did
}

// crashRun is what a disruption may look at while the jobs go on.
type crashRun struct {
	executions func() int    // so far, duplicates included
	finished   func() bool   // every job at its final attempt
	revive     func()        // start the workers that exited again
	where      func() string // where the jobs are, for a failure
}

func runCrash(t *testing.T, setup crashSetup) {
	const queueName = "crash"
	broker := setup.observer
	ctx := context.Background()
	b, err := rabbitmq.Open(ctx, setup.urls[0], rabbitmq.WithLogger(quietLog), rabbitmq.WithFailover(setup.urls[1:]...))
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
	var wantExec, wantDead int
	ids := make([]string, setup.jobs)
	for i := range ids {
		ids[i] = fmt.Sprintf("j%05d", i)
		final, dead := expected(ids[i])
		wantExec += int(final)
		if dead != "" {
			wantDead++
		}
	}
	ledger := filepath.Join(t.TempDir(), "ledger")
	f := newMixedFleet(t, "crash", 4, setup.java, "BACKSTOP_RELIABILITY_URL="+strings.Join(setup.urls, " "), "BACKSTOP_RELIABILITY_QUEUE="+queueName,
		"BACKSTOP_RELIABILITY_LEDGER="+ledger, "BACKSTOP_RELIABILITY_MAX_DELIVERIES=50",
		"BACKSTOP_RELIABILITY_PREFETCH=32", "BACKSTOP_RELIABILITY_CONCURRENCY=8")
	// A JVM takes seconds to start: the jobs come once the Java workers
	// consume, so that they take part from the first job.
	if setup.java > 0 {
		eventually.True(t, 90*time.Second, "the Java workers consuming", func() bool {
			st, err := os.Stat(ledger + ".ready")
			return err == nil && st.Size() >= int64(setup.java)
		})
	}
	enqueueAll(t, b, q, ids)

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
	var disruption string
	step := wantExec / 40
	for next := step; next < wantExec*9/10; next += step {
		if err := eventually.Wait(90*time.Second, func() bool { f.revive(); return executions() >= next }); err != nil {
			t.Fatalf("stalled at %d of %d executions after %d kills, %d disruptions (%s)\n%s", executions(), wantExec, kills, restarts,
				disruption, whereAre(t, broker, ledger, ids))
		}
		f.kill(rng.IntN(len(f.procs)))
		kills++
		if restarts < 2 && next >= wantExec*(restarts+1)/3 {
			disruption = setup.disrupt(t, crashRun{
				executions: executions,
				finished:   func() bool { return readLedger(t, ledger).final == setup.jobs },
				revive:     func() { f.revive() },
				where:      func() string { return whereAre(t, setup.observer, ledger, ids) },
			})
			restarts++
			if !broker.Running() || conn.IsClosed() {
				conn = broker.Dial(t)
			}
		}
	}
	// Drained: every job executed at its final attempt, as many dead
	// letters as fates say, nothing ready or unacked in the queue, nothing
	// in the delay.
	var got ledgerSummary
	if err := eventually.Wait(90*time.Second, func() bool {
		f.revive()
		got = readLedger(t, ledger)
		if got.final < setup.jobs || depth(rabbitmq.NamesFor(queueName).DLQ) < wantDead || depth(queueName) != 0 {
			return false
		}
		for _, l := range levels() {
			if depth(l) != 0 || unacked(t, broker, l) != 0 {
				return false
			}
		}
		return unacked(t, broker, queueName) == 0
	}); err != nil {
		t.Fatalf("not every job reached its end after %d kills, %d disruptions (%s)\n%s", kills, restarts, disruption,
			whereAre(t, broker, ledger, ids))
	}
	f.stop()
	elapsed := time.Since(start)

	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	dead := map[string]int{}
	byReason := map[string]int{}
	for {
		d, ok, err := ch.Get(rabbitmq.NamesFor(queueName).DLQ, true)
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
	for _, name := range []string{queueName, rabbitmq.NamesFor(queueName).DLQ} {
		if n := depth(name); n != 0 {
			t.Errorf("%s holds %d messages after the run", name, n)
		}
	}
	for _, l := range levels() {
		if d := depth(l); d != 0 {
			t.Errorf("delay level %s holds %d messages after the run", l, d)
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
	if setup.java > 0 {
		st, err := os.Stat(ledger + ".java")
		if err != nil || st.Size() == 0 {
			t.Errorf("the Java workers executed no job (%v)", err)
		} else {
			t.Logf("%d executions by the Java workers", st.Size())
		}
	}
	if kills < 20 || restarts < 2 {
		t.Errorf("%d kills and %d disruptions, want at least 20 and 2", kills, restarts)
	}
	t.Logf("%d jobs in %v: %d succeeded, %d dead-lettered %v; %d worker kills (%d worker starts), %d × %s; "+
		"%d executions for %d needed: %d duplicate executions (%.2f%%), %d duplicate dead letters",
		setup.jobs, elapsed.Round(time.Millisecond), len(got.succeeded), len(dead), byReason, kills, f.starts, restarts, disruption,
		got.executions, wantExec, got.executions-got.distinct, 100*float64(got.executions-got.distinct)/float64(got.executions), deadDups)
}

// levels are the delay level queues: the hold levels and the first
// topology's TTL levels (which nothing routes to any more).
func levels() []string {
	var ls []string
	for n := range 18 {
		if n <= 10 {
			ls = append(ls, "backstop.hold.L"+strconv.Itoa(n))
		}
		ls = append(ls, "backstop.delay.L"+strconv.Itoa(n))
	}
	return ls
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
func enqueueAll(t *testing.T, b *rabbitmq.Broker, q *rabbitmq.Queue, ids []string, opts ...rabbitmq.EnqueueOption) {
	t.Helper()
	ctx := context.Background()
	const writers = 8
	errs := make(chan error, writers)
	for w := range writers {
		go func() {
			for i := w; i < len(ids); i += writers {
				if err := q.Enqueue(ctx, ids[i], []byte(`{"job":"`+ids[i]+`"}`), opts...); err != nil {
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

// unacked is the queue's count of unacked deliveries (management API;
// -1 when it does not say).
func unacked(t *testing.T, broker *rabbittest.Broker, name string) int {
	return queueFigure(broker, name, "messages_unacknowledged")
}

// messages is the queue's count of messages, ready and unacked
// (management API; -1 when it does not say).
func messages(t *testing.T, broker *rabbittest.Broker, name string) int {
	return queueFigure(broker, name, "messages")
}

func queueFigure(broker *rabbittest.Broker, name, field string) int {
	req, _ := http.NewRequest(http.MethodGet, broker.ManagementURL()+"/api/queues/%2F/"+name, nil)
	req.SetBasicAuth("guest", "guest")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var info map[string]any
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&info) != nil {
		return -1
	}
	n, ok := info[field].(float64)
	if !ok {
		return -1
	}
	return int(n)
}

// whereAre says where the messages are and which jobs have not reached
// their end, for a stall's failure message: every queue's figures from the
// management API (ready, unacked, and for a quorum queue the messages
// held for at-least-once dead lettering), and the unfinished jobs' last
// executions.
func whereAre(t *testing.T, broker *rabbittest.Broker, ledger string, ids []string) string {
	var b strings.Builder
	b.WriteString(queueDump(broker))
	// The quorum queues' dead-letter workers: what each holds unsettled.
	out, err := broker.Ctl("eval", `[sys:get_status(P) || {_, P, _, _} <- supervisor:which_children(rabbit_fifo_dlx_sup)].`)
	fmt.Fprintf(&b, "dead-letter workers (%v): %.6000s\n", err, out)
	n := 0
	for _, l := range strings.Split(broker.LogTail(2000), "\n") {
		if n < 40 && (strings.Contains(l, "[warning]") || strings.Contains(l, "[error]")) && !strings.Contains(l, "connection") {
			fmt.Fprintf(&b, "broker log: %s\n", l)
			n++
		}
	}
	data, _ := os.ReadFile(ledger)
	last := map[string]string{}
	for line := range bytes.Lines(data) {
		last[string(bytes.TrimSpace(line[:6]))] = string(bytes.TrimSpace(line))
	}
	s := readLedger(t, ledger)
	var missing []string
	for _, id := range ids {
		final, _ := expected(id)
		if l := last[id]; l == "" || int64(l[7]-'0') != final {
			missing = append(missing, fmt.Sprintf("%s (final attempt %d, last run %q)", id, final, l))
		}
	}
	fmt.Fprintf(&b, "%d jobs short of their final attempt (%d executions, %d at their final attempt)", len(missing), s.executions, s.final)
	dead := deadLettersOf(broker, "crash.dlq")
	for i, m := range missing {
		if i == 20 {
			fmt.Fprintf(&b, "\n  …")
			break
		}
		fmt.Fprintf(&b, "\n  %s", m)
		if d := dead[m[:6]]; d != "" {
			fmt.Fprintf(&b, "; in the DLQ: %s", d)
		}
	}
	return b.String()
}

// deadLettersOf reads the dead letters of queue dlq without taking them
// (unacked, they go back when the channel closes) and says, by job id,
// why each is there: backstop's reason, or the broker's own (x-death),
// which tells a job the worker dead-lettered from one the broker did.
func deadLettersOf(broker *rabbittest.Broker, dlq string) map[string]string {
	why := map[string]string{}
	conn, err := amqp.Dial(broker.URL())
	if err != nil {
		return why
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return why
	}
	defer ch.Close()
	for range 100_000 {
		d, ok, err := ch.Get(dlq, false)
		if err != nil || !ok {
			break
		}
		r := fmt.Sprintf("backstop-reason %v", d.Headers[rabbitmq.HeaderReason])
		if deaths, ok := d.Headers["x-death"].([]any); ok && len(deaths) > 0 {
			if x, ok := deaths[0].(amqp.Table); ok {
				r += fmt.Sprintf(", x-death reason %v from %v (count %v)", x["reason"], x["queue"], x["count"])
			}
		}
		why[d.MessageId] += r + " "
	}
	return why
}

// queueDump is every queue's figures from the management API: ready,
// unacked, held for at-least-once dead lettering, consumers, leader node.
func queueDump(broker *rabbittest.Broker) string {
	var b strings.Builder
	req, _ := http.NewRequest(http.MethodGet, broker.ManagementURL()+"/api/queues/%2F", nil)
	req.SetBasicAuth("guest", "guest")
	if resp, err := http.DefaultClient.Do(req); err != nil {
		fmt.Fprintf(&b, "management API: %v\n", err)
	} else {
		var qs []map[string]any
		json.NewDecoder(resp.Body).Decode(&qs)
		resp.Body.Close()
		for _, q := range qs {
			fmt.Fprintf(&b, "queue %v: messages %v ready %v unacked %v dlx %v consumers %v leader %v members %v online %v\n", q["name"], q["messages"],
				q["messages_ready"], q["messages_unacknowledged"], q["messages_dlx"], q["consumers"], q["leader"], q["members"], q["online"])
		}
	}
	return b.String()
}

// The stall's dump says why a job is in the DLQ, and leaves it there.
func TestDeadLettersOfSaysWhoDeadLettered(t *testing.T) {
	broker := rabbittest.Start(t)
	ch := broker.Channel(t)
	if _, err := ch.QueueDeclare("t.dlq", true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	if err := ch.Publish("", "t.dlq", false, false, amqp.Publishing{MessageId: "j00001", Headers: amqp.Table{
		"x-death": []any{amqp.Table{"reason": "delivery_limit", "queue": "crash", "count": int64(53)}},
	}}); err != nil {
		t.Fatal(err)
	}
	var why map[string]string
	eventually.True(t, 10*time.Second, "the dead letter read", func() bool {
		why = deadLettersOf(broker, "t.dlq")
		return why["j00001"] != ""
	})
	if !strings.Contains(why["j00001"], "x-death reason delivery_limit from crash (count 53)") {
		t.Errorf("deadLettersOf = %q, want the broker's reason", why["j00001"])
	}
	eventually.True(t, 10*time.Second, "the dead letter back in its queue", func() bool {
		st, err := ch.QueueDeclarePassive("t.dlq", true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
		return err == nil && st.Messages == 1
	})
}
