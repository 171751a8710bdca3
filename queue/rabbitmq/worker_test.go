package rabbitmq

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
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/internal/testing/logbuf"
	"github.com/backstop-dev/backstop/internal/testing/rabbittest"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/queue"
)

const wait = 60 * time.Second // a deadline that catches a hang, never asserted

func openBroker(t *testing.T, url string, opts ...Option) *Broker {
	t.Helper()
	b, err := Open(context.Background(), url, append([]Option{WithReconnectBackoff(50*time.Millisecond, 500*time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func native(t *testing.T, src string) backstop.Decider {
	t.Helper()
	p, err := policy.Parse([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return backstop.Native(p)
}

// work runs q.Work until the test ends (or stop is called) and checks that
// it returns nil.
func work(t *testing.T, q *Queue, p backstop.Decider, h queue.Handler, opts ...WorkOption) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- q.Work(ctx, p, h, opts...) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Work returned %v, want nil after shutdown", err)
				}
			case <-time.After(wait):
				t.Errorf("Work did not return within %v of shutdown", wait)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func depth(t *testing.T, ch *amqp.Channel, name string) int {
	t.Helper()
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("queue %s: %v", name, err)
	}
	return q.Messages
}

// takeAll takes (and acks) every message of a queue.
func takeAll(t *testing.T, ch *amqp.Channel, name string) []amqp.Delivery {
	t.Helper()
	var out []amqp.Delivery
	for {
		d, ok, err := ch.Get(name, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

func header(d amqp.Delivery, k string) string {
	_, s, _ := headerDigits(d.Headers[k])
	if s == "" {
		s = headerString(d.Headers, k)
	}
	return s
}

func TestDelayKey(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		secs int64
	}{{0, 0}, {-time.Second, 0}, {time.Millisecond, 1}, {time.Second, 1}, {1001 * time.Millisecond, 2},
		{2047 * time.Second, 2047}, {24 * time.Hour, maxDelaySecs}, {1000 * time.Hour, maxDelaySecs}} {
		if got := delaySeconds(c.d); got != c.secs {
			t.Errorf("delaySeconds(%v) = %d, want %d", c.d, got, c.secs)
		}
	}
	if got := delayRoutingKey(5); got != "0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.0.1" {
		t.Errorf("delayRoutingKey(5) = %q", got)
	}
	if got := levelPattern(17, '1'); got != "1.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*" {
		t.Errorf("levelPattern(17, 1) = %q", got)
	}
	if got := levelPattern(0, '0'); got != "*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.0" {
		t.Errorf("levelPattern(0, 0) = %q", got)
	}
	if got := enterPattern(3); got != "0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.*.*.*" {
		t.Errorf("enterPattern(3) = %q", got)
	}
	if got := enterPattern(17); got != "1.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*" {
		t.Errorf("enterPattern(17) = %q", got)
	}
}

// A held delivery leaves its level 2^n s after it arrived, or earlier when
// its due time says it entered before (it waited for a mover): due less
// the delay still to go below n.
func TestReleaseAt(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	due := func(ms int64) amqp.Table { return amqp.Table{HeaderDueMs: itoa(ms)} }
	key13 := delayRoutingKey(13) // bits 3, 2, 0
	for _, c := range []struct {
		name string
		n    int
		key  string
		h    amqp.Table
		want time.Time
	}{
		{"on time: due is 5 s after the hold of 8 s", 3, key13, due(now.UnixMilli() + 13_000), now.Add(8 * time.Second)},
		{"waited 2 s for a mover", 3, key13, due(now.UnixMilli() + 11_000), now.Add(6 * time.Second)},
		{"waited past its time: at once", 3, key13, due(now.UnixMilli() - 1_000), now.Add(-6 * time.Second)},
		{"level 0: due itself", 0, delayRoutingKey(1), due(now.UnixMilli() + 500), now.Add(500 * time.Millisecond)},
		{"a capped delay: the hold, not the far due", 10, delayRoutingKey(maxDelaySecs), due(now.UnixMilli() + 3_600_000), now.Add(1024 * time.Second)},
		{"no due", 2, key13, amqp.Table{}, now.Add(4 * time.Second)},
		{"garbage due", 2, key13, due(-5), now.Add(4 * time.Second)},
		{"a key not backstop's", 2, "a.b", due(now.UnixMilli()), now.Add(4 * time.Second)},
	} {
		if got := releaseAt(c.n, c.key, c.h, now); !got.Equal(c.want) {
			t.Errorf("%s: releaseAt = %v, want %v", c.name, got.Sub(now), c.want.Sub(now))
		}
	}
}

func TestDecode(t *testing.T) {
	good := amqp.Table{HeaderAttempt: "2", HeaderFirstEnqueuedMs: "1700000000000", HeaderJobType: "send_email",
		HeaderLastReason: "transient", HeaderPrevDelayMs: int32(250)}
	j := Decode(amqp.Delivery{MessageId: "a", Headers: good, Body: []byte("x")})
	if j.Malformed || j.ID != "a" || j.Attempt != 2 || j.FirstEnqueuedMs != 1700000000000 || j.Type != "send_email" ||
		j.LastReason != "transient" || j.PrevDelayMs != 250 || string(j.Payload) != "x" || j.EntryID != "" {
		t.Errorf("Decode = %+v", j)
	}
	if j := Decode(amqp.Delivery{MessageId: "a", Headers: amqp.Table{HeaderAttempt: int64(3), HeaderFirstEnqueuedMs: int64(5)}}); j.Malformed || j.Attempt != 3 {
		t.Errorf("AMQP integers: %+v, want attempt 3, well formed", j)
	}
	for name, h := range map[string]amqp.Table{
		"attempt 0":            {HeaderAttempt: "0", HeaderFirstEnqueuedMs: "1"},
		"attempt 01":           {HeaderAttempt: "01", HeaderFirstEnqueuedMs: "1"},
		"attempt garbage":      {HeaderAttempt: "x", HeaderFirstEnqueuedMs: "1"},
		"attempt negative":     {HeaderAttempt: int64(-1), HeaderFirstEnqueuedMs: "1"},
		"attempt 10^14":        {HeaderAttempt: "100000000000000", HeaderFirstEnqueuedMs: "1"},
		"attempt missing":      {HeaderFirstEnqueuedMs: "1"},
		"first not digits":     {HeaderAttempt: "1", HeaderFirstEnqueuedMs: "12a"},
		"first missing":        {HeaderAttempt: "1"},
		"attempt a float":      {HeaderAttempt: 1.0, HeaderFirstEnqueuedMs: "1"},
		"first signed":         {HeaderAttempt: "1", HeaderFirstEnqueuedMs: "-5"},
		"attempt with a space": {HeaderAttempt: " 1", HeaderFirstEnqueuedMs: "1"},
	} {
		if j := Decode(amqp.Delivery{MessageId: "a", Headers: h}); !j.Malformed {
			t.Errorf("%s: not malformed: %+v", name, j)
		}
	}
	if j := Decode(amqp.Delivery{Headers: good}); !j.Malformed {
		t.Errorf("no message_id: not malformed")
	}
}

// Declare twice is fine, the levels exist with their TTLs, and a queue
// declared with another max deliveries is refused by name.
func TestDeclare(t *testing.T) {
	rb := shared.Broker(t)
	b := openBroker(t, rb.URL())
	ctx := context.Background()
	q := b.Queue("declare")
	for range 2 {
		if err := q.Declare(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Queue("declare2").Declare(ctx); err != nil {
		t.Fatal(err)
	}
	ch := rb.Channel(t)
	for _, n := range []string{"declare", "declare.dlq", "backstop.hold.L0", "backstop.hold.L10", "backstop.delay.L0", "backstop.delay.L17"} {
		depth(t, ch, n)
	}
	for _, x := range []string{"declare.delay", "declare.due", "backstop.delay.deliver", "backstop.delay.enter", "backstop.delay.L9"} {
		if err := ch.ExchangeDeclarePassive(x, "", true, false, false, false, nil); err != nil {
			t.Fatalf("exchange %s: %v", x, err)
		}
	}
	// Q.delay enters the levels through backstop.delay.enter only: a
	// queue declared when it was bound to L17 loses that binding.
	if err := ch.ExchangeBind("backstop.delay.L17", "", "declare.delay", false, nil); err != nil {
		t.Fatal(err)
	}
	if err := q.Declare(ctx); err != nil {
		t.Fatal(err)
	}
	var bs []struct {
		Destination string `json:"destination"`
	}
	mgmtGet(t, rb.ManagementURL(), "/api/exchanges/%2F/declare.delay/bindings/source", &bs)
	if len(bs) != 1 || bs[0].Destination != "backstop.delay.enter" {
		t.Errorf("declare.delay is bound to %v, want backstop.delay.enter only", bs)
	}
	err := b.Queue("declare", WithMaxDeliveries(9)).Declare(ctx)
	if err == nil || !strings.Contains(err.Error(), "declare") || !strings.Contains(err.Error(), "PRECONDITION_FAILED") {
		t.Fatalf("Declare with another max deliveries = %v, want PRECONDITION_FAILED naming the queue", err)
	}
	// The refusal closed a channel, not the connection: the queue works.
	if err := q.Enqueue(ctx, "after", nil); err != nil {
		t.Fatal(err)
	}
	if err := b.Queue("").Declare(ctx); err == nil || !strings.Contains(err.Error(), "queue name") {
		t.Errorf("empty name: %v", err)
	}
	if err := q.Enqueue(ctx, "", nil); err == nil || !strings.Contains(err.Error(), "id") {
		t.Errorf("empty id: %v", err)
	}
	if err := q.Enqueue(ctx, "x", nil, JobType("bad type")); err == nil || !strings.Contains(err.Error(), "JobType") {
		t.Errorf("bad job type: %v", err)
	}
}

// Without WithConcurrency, as many jobs run at once as the prefetch (as
// the Node and Python workers): four handlers that wait for each other
// all finish.
func TestConcurrencyDefaultsToPrefetch(t *testing.T) {
	rb := shared.Broker(t)
	b := openBroker(t, rb.URL())
	ctx := context.Background()
	q := b.Queue("concurrency")
	const n = 4
	for i := range n {
		if err := q.Enqueue(ctx, fmt.Sprintf("job-%d", i), nil); err != nil {
			t.Fatal(err)
		}
	}
	arrived, release := make(chan string, n), make(chan struct{})
	var done atomic.Int64
	work(t, q, native(t, `{"max_attempts": 3}`), func(ctx context.Context, j queue.Job) error {
		arrived <- j.ID
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		done.Add(1)
		return nil
	}, WithPrefetch(n))
	for i := range n {
		select {
		case <-arrived:
		case <-time.After(wait):
			t.Fatalf("%d of %d jobs running at once with WithPrefetch(%d), want all", i, n, n)
		}
	}
	close(release)
	eventually.True(t, wait, "the jobs to finish", func() bool { return done.Load() == n })
}

// A job runs once, with its headers, and is acked; the metrics say so.
func TestEnqueueWorkSuccess(t *testing.T) {
	rb := shared.Broker(t)
	b := openBroker(t, rb.URL())
	ctx := context.Background()
	q := b.Queue("success")
	if err := q.Enqueue(ctx, "job-1", []byte("payload\x00bytes"), JobType("send_email"), ContentType("application/octet-stream")); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	got := make(chan queue.Job, 1)
	work(t, q, native(t, `{"max_attempts": 3}`), func(_ context.Context, j queue.Job) error {
		got <- j
		return nil
	}, WithMetrics(reg, "default"))
	var j queue.Job
	select {
	case j = <-got:
	case <-time.After(wait):
		t.Fatal("the job did not run")
	}
	if j.ID != "job-1" || j.Attempt != 1 || j.Type != "send_email" || string(j.Payload) != "payload\x00bytes" || j.FirstEnqueuedMs == 0 {
		t.Errorf("job %+v", j)
	}
	eventually.True(t, wait, "the success counted", func() bool {
		return metric(t, reg, "backstop_attempts_total", map[string]string{"queue": "success", "job_type": "send_email", "outcome": "success"}) == 1
	})
	ch := rb.Channel(t)
	if n := depth(t, ch, "success"); n != 0 {
		t.Errorf("queue holds %d messages after the ack, want 0", n)
	}
	if v := metric(t, reg, "backstop_job_attempts", map[string]string{"queue": "success", "job_type": "send_email", "outcome": "success"}); v != 1 {
		t.Errorf("backstop_job_attempts count %v, want 1", v)
	}
	if v := metric(t, reg, "backstop_client_attempts_total", map[string]string{"policy": "default", "target": "success", "outcome": "success"}); v != 1 {
		t.Errorf("backstop_client_attempts_total{outcome=success} = %v, want 1", v)
	}
}

// metric is the value of a counter (or a histogram's count) in reg with
// exactly these labels; 0 when absent.
func metric(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; !ok || v != l.GetValue() {
					continue next
				}
			}
			if m.GetHistogram() != nil {
				return float64(m.GetHistogram().GetSampleCount())
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// A failed job comes back through the delay levels with attempt + 1 and
// the previous reason and error; after max attempts it is dead-lettered
// with its reason and error, its body and type kept.
func TestRetryThenDeadLetter(t *testing.T) {
	rb := shared.Broker(t)
	b := openBroker(t, rb.URL())
	ctx := context.Background()
	q := b.Queue("retry")
	if err := q.Enqueue(ctx, "job-r", []byte("body"), JobType("charge_card")); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	var mu sync.Mutex
	var seen []queue.Job
	var seenAt []time.Time
	work(t, q, native(t, `{"max_attempts": 3, "backoff": {"base": "10ms", "cap": "20ms"}, "jitter": {"mode": "none"}}`),
		func(_ context.Context, j queue.Job) error {
			mu.Lock()
			seen, seenAt = append(seen, j), append(seenAt, time.Now())
			mu.Unlock()
			return &backstop.Failure{HTTPStatus: 503, Err: fmt.Errorf("upstream 503 on attempt %d", j.Attempt)}
		}, WithMetrics(reg, "default"))
	ch := rb.Channel(t)
	eventually.True(t, wait, "the dead letter", func() bool { return depth(t, ch, "retry.dlq") == 1 })
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 3 {
		t.Fatalf("ran %d times, want 3", len(seen))
	}
	for i, j := range seen {
		if j.Attempt != int64(i+1) || j.ID != "job-r" || j.Type != "charge_card" || string(j.Payload) != "body" || j.FirstEnqueuedMs != seen[0].FirstEnqueuedMs {
			t.Errorf("delivery %d: %+v", i, j)
		}
		if i > 0 {
			if j.LastReason != "transient" || j.LastError != fmt.Sprintf("upstream 503 on attempt %d", i) || j.PrevDelayMs <= 0 {
				t.Errorf("delivery %d: last reason %q, error %q, prev delay %d", i, j.LastReason, j.LastError, j.PrevDelayMs)
			}
			// The delay (10 ms) is rounded up to 1 s: never early.
			if gap := seenAt[i].Sub(seenAt[i-1]); gap < time.Duration(j.PrevDelayMs)*time.Millisecond {
				t.Errorf("delivery %d came %v after the previous one, before its delay %d ms", i, gap, j.PrevDelayMs)
			}
		}
	}
	dl := takeAll(t, ch, "retry.dlq")[0]
	if dl.MessageId != "job-r" || string(dl.Body) != "body" || header(dl, HeaderReason) != "max_attempts_reached" ||
		header(dl, HeaderError) != "upstream 503 on attempt 3" || header(dl, HeaderAttempt) != "3" ||
		header(dl, HeaderJobType) != "charge_card" || header(dl, HeaderDeadLetteredMs) == "" || header(dl, HeaderDestination) != "retry" {
		t.Errorf("dead letter %s: %v", dl.MessageId, dl.Headers)
	}
	labels := func(kv ...string) map[string]string {
		m := map[string]string{"queue": "retry", "job_type": "charge_card"}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"backstop_attempts_total", labels("outcome", "retry"), 2},
		{"backstop_attempts_total", labels("outcome", "dead_letter"), 1},
		{"backstop_retries_total", labels("reason", "transient"), 2},
		{"backstop_dead_letters_total", labels("reason", "max_attempts_reached"), 1},
		{"backstop_max_attempts_reached_total", labels(), 1},
		{"backstop_job_attempts", labels("outcome", "dead_letter"), 1},
	} {
		if got := metric(t, reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}

// Malformed deliveries go to the DLQ with reason malformed, every header
// and the body kept; the handler never sees them.
func TestMalformed(t *testing.T) {
	rb := shared.Broker(t)
	b := openBroker(t, rb.URL())
	ctx := context.Background()
	q := b.Queue("malformed")
	if err := q.Declare(ctx); err != nil {
		t.Fatal(err)
	}
	ch := rb.Channel(t)
	for i, m := range []amqp.Publishing{
		{Headers: amqp.Table{HeaderAttempt: "1", HeaderFirstEnqueuedMs: "1"}},                        // no message_id
		{MessageId: "m2", Headers: amqp.Table{HeaderAttempt: "garbage", HeaderFirstEnqueuedMs: "1"}}, // attempt
		{MessageId: "m3", Headers: amqp.Table{HeaderAttempt: "1", HeaderFirstEnqueuedMs: "12a", "custom": "kept"}},
	} {
		m.Body = []byte(fmt.Sprintf("body-%d", i))
		if err := ch.PublishWithContext(ctx, "", "malformed", false, false, m); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	var ran atomic.Int64
	work(t, q, native(t, `{"max_attempts": 3}`), func(context.Context, queue.Job) error { ran.Add(1); return nil }, WithMetrics(reg, "default"))
	eventually.True(t, wait, "three dead letters", func() bool { return depth(t, ch, "malformed.dlq") == 3 })
	bodies := map[string]bool{}
	for _, d := range takeAll(t, ch, "malformed.dlq") {
		bodies[string(d.Body)] = true
		if header(d, HeaderReason) != "malformed" || header(d, HeaderError) != MalformedError {
			t.Errorf("%q: reason %q error %q", d.Body, header(d, HeaderReason), header(d, HeaderError))
		}
		if d.MessageId == "m3" && (header(d, "custom") != "kept" || header(d, HeaderFirstEnqueuedMs) != "12a") {
			t.Errorf("m3 lost its headers: %v", d.Headers)
		}
	}
	if len(bodies) != 3 || ran.Load() != 0 {
		t.Errorf("dead letters %v, handler ran %d times; want the three bodies, no run", bodies, ran.Load())
	}
	if got := metric(t, reg, "backstop_dead_letters_total", map[string]string{"queue": "malformed", "job_type": "", "reason": "malformed"}); got != 3 {
		t.Errorf("dead letters counted %v, want 3", got)
	}
	if n := depth(t, ch, "malformed"); n != 0 {
		t.Errorf("the queue holds %d, want 0", n)
	}
}

// A message delivered max-deliveries times already (its consumers died) is
// dead-lettered as crash_loop without running.
func TestCrashLoop(t *testing.T) {
	rb := shared.Broker(t)
	b := openBroker(t, rb.URL())
	ctx := context.Background()
	q := b.Queue("crash", WithMaxDeliveries(2))
	if err := q.Enqueue(ctx, "poison", []byte("p")); err != nil {
		t.Fatal(err)
	}
	ch := rb.Channel(t)
	// Two deliveries of poison that end without an outcome (as a consumer
	// that dies): x-delivery-count becomes 2. It is alone in the queue, so
	// the test depends on no order of delivery.
	for range 2 {
		d, ok, err := ch.Get("crash", false)
		if err != nil || !ok || d.MessageId != "poison" {
			t.Fatalf("get: %v %v %s", ok, err, d.MessageId)
		}
		if err := d.Nack(false, true); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.Enqueue(ctx, "fine", []byte("f")); err != nil {
		t.Fatal(err)
	}
	var ran sync.Map
	work(t, q, native(t, `{"max_attempts": 3}`), func(_ context.Context, j queue.Job) error { ran.Store(j.ID, true); return nil })
	eventually.True(t, wait, "poison dead-lettered and fine run", func() bool {
		_, ok := ran.Load("fine")
		return ok && depth(t, ch, "crash.dlq") == 1
	})
	if _, ok := ran.Load("poison"); ok {
		t.Error("the crash loop ran")
	}
	d := takeAll(t, ch, "crash.dlq")[0]
	if d.MessageId != "poison" || header(d, HeaderReason) != "crash_loop" || !strings.Contains(header(d, HeaderError), "delivered 3 times") {
		t.Errorf("dead letter %s: %v", d.MessageId, d.Headers)
	}
	// The DLQ's own delivery count starts afresh (0 or absent), not at the
	// work queue's 2.
	if c := header(d, "x-delivery-count"); c != "" && c != "0" {
		t.Errorf("the dead letter kept the work queue's x-delivery-count: %v", d.Headers)
	}
}

// An open breaker refuses jobs before they run: they are deferred
// (circuit_open, attempt unchanged) to the delay levels, and the worker
// starts nothing more until the breaker may half-open; shutdown ends that
// wait at once.
func TestOpenBreakerDefers(t *testing.T) {
	var ran atomic.Int64
	rb := shared.Broker(t)
	logs := &logbuf.Buffer{}
	b := openBroker(t, rb.URL(), WithLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("ran %d; logs:\n%s", ran.Load(), logs)
		}
	})
	ctx := context.Background()
	q := b.Queue("breaker")
	for i := range 3 {
		if err := q.Enqueue(ctx, fmt.Sprintf("job-%d", i), nil); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	stop := work(t, q, native(t, `{"max_attempts": 3, "backoff": {"base": "10ms", "cap": "20ms"}, "jitter": {"mode": "none"},
	 "circuit_breaker": {"failure_threshold": 1, "open_for": "1h"}}`), func(context.Context, queue.Job) error {
		ran.Add(1)
		return &backstop.Failure{HTTPStatus: 503, Err: errors.New("503")}
	}, WithMetrics(reg, "default"), WithPrefetch(1))
	deferred := func() float64 {
		return metric(t, reg, "backstop_deferrals_total", map[string]string{"queue": "breaker", "job_type": "", "reason": "circuit_open"})
	}
	eventually.True(t, wait, "the first job deferred", func() bool { return deferred() == 1 })
	ch := rb.Channel(t)
	// The worker holds the next delivery (prefetch 1) without running it.
	eventually.True(t, wait, "the next job held", func() bool {
		st, err := ch.QueueDeclarePassive("breaker", true, false, false, false, nil)
		return err == nil && st.Messages == 1
	})
	stop()
	if ran.Load() != 1 || deferred() != 1 {
		t.Errorf("ran %d, deferred %v: want 1 and 1", ran.Load(), deferred())
	}
	eventually.True(t, wait, "the 2 jobs not run back in the queue", func() bool { return depth(t, ch, "breaker") == 2 })
	if got := metric(t, reg, "backstop_attempts_total", map[string]string{"queue": "breaker", "job_type": "", "outcome": "deferred"}); got != 1 {
		t.Errorf("attempts deferred = %v, want 1", got)
	}
	// The deferred job (1 h) hops the levels for 2047 s (every bit up to
	// 10): it waits in hold.L10, back there since the worker's mover
	// stopped with it.
	eventually.True(t, wait, "the deferred job in hold.L10", func() bool { return depth(t, ch, "backstop.hold.L10") >= 1 })
}

// A message that arrives before its backstop-due-ms is delayed again for
// the remainder and runs no earlier than due, its attempt unchanged.
func TestEarlyDeliveryWaits(t *testing.T) {
	rb := shared.Broker(t)
	b := openBroker(t, rb.URL())
	ctx := context.Background()
	q := b.Queue("early")
	if err := q.Declare(ctx); err != nil {
		t.Fatal(err)
	}
	due := time.Now().Add(1500 * time.Millisecond).UnixMilli()
	ch := rb.Channel(t)
	if err := ch.PublishWithContext(ctx, "", "early", false, false, amqp.Publishing{MessageId: "e", Headers: amqp.Table{
		HeaderAttempt: "2", HeaderFirstEnqueuedMs: "1", HeaderDueMs: itoa(due), HeaderDestination: "early"}}); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	got := make(chan time.Time, 2)
	var attempt atomic.Int64
	work(t, q, native(t, `{"max_attempts": 3}`), func(_ context.Context, j queue.Job) error {
		attempt.Store(j.Attempt)
		got <- time.Now()
		return nil
	}, WithMetrics(reg, "default"))
	select {
	case at := <-got:
		if at.UnixMilli() < due || attempt.Load() != 2 {
			t.Errorf("ran at %d (attempt %d), due %d: want no earlier, attempt 2", at.UnixMilli(), attempt.Load(), due)
		}
	case <-time.After(wait):
		t.Fatal("the early job never ran")
	}
	eventually.True(t, wait, "the success counted", func() bool {
		return metric(t, reg, "backstop_attempts_total", map[string]string{"queue": "early", "job_type": "", "outcome": "success"}) == 1
	})
	if got := metric(t, reg, "backstop_deferrals_total", map[string]string{"queue": "early", "job_type": "", "reason": ""}); got != 0 {
		t.Errorf("the re-delay was counted as a deferral")
	}
}

// Shutdown waits for the running job, applies its outcome, and returns;
// the deliveries not started go back to the queue. One job runs at a time
// (concurrency 1) while the broker sends both (prefetch 2). Which of the two
// the worker gets first is not asserted: a quorum queue hands out in order
// of arrival, but a message returned by an earlier consumer (this shared
// broker's other tests, a reconnect) goes out again first, and RabbitMQ
// promises no order across either.
func TestGracefulShutdown(t *testing.T) {
	rb := shared.Broker(t)
	b := openBroker(t, rb.URL())
	ctx := context.Background()
	q := b.Queue("shutdown")
	for _, id := range []string{"first", "second"} {
		if err := q.Enqueue(ctx, id, nil); err != nil {
			t.Fatal(err)
		}
	}
	started, release := make(chan string, 2), make(chan struct{})
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- q.Work(wctx, native(t, `{"max_attempts": 3}`), func(_ context.Context, j queue.Job) error {
			started <- j.ID
			<-release // ignores ctx: a job that finishes its work
			return nil
		}, WithPrefetch(2), WithConcurrency(1))
	}()
	ran := <-started
	other := map[string]string{"first": "second", "second": "first"}[ran]
	if other == "" {
		t.Fatalf("ran %q, want first or second", ran)
	}
	// Both delivered before the shutdown (none ready): the worker holds
	// the other, not started.
	ch := rb.Channel(t)
	eventually.True(t, wait, "both jobs delivered", func() bool { return depth(t, ch, "shutdown") == 0 })
	cancel()
	select {
	case err := <-done:
		t.Fatalf("Work returned (%v) while a job ran", err)
	default:
	}
	close(release)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(wait):
		t.Fatal("Work did not return after the job finished")
	}
	if len(started) != 0 {
		t.Errorf("a job started after shutdown: %q", <-started)
	}
	eventually.True(t, wait, other+" back in the queue", func() bool { return depth(t, ch, "shutdown") == 1 })
	d := takeAll(t, ch, "shutdown")
	if len(d) != 1 || d[0].MessageId != other {
		t.Errorf("queue holds %v, want %s only (%s acked)", d, other, ran)
	}
}

// A broker restart (after a crash): Work keeps going on the new connection, Enqueue waits
// for it and publishes; nothing is lost.
func TestReconnectAfterRestart(t *testing.T) {
	rb := rabbittest.Start(t)
	logs := &logbuf.Buffer{}
	b := openBroker(t, rb.URL(), WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	ctx := context.Background()
	q := b.Queue("reconnect")
	var ran sync.Map
	work(t, q, native(t, `{"max_attempts": 3}`), func(_ context.Context, j queue.Job) error { ran.Store(j.ID, true); return nil })
	if err := q.Enqueue(ctx, "before", nil); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, wait, "before run", func() bool { _, ok := ran.Load("before"); return ok })
	rb.KillAndRestart(t) // a crash: the harsher restart, and a faster one
	ectx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if err := q.Enqueue(ectx, "after", nil); err != nil {
		t.Fatalf("Enqueue after the restart: %v\n%s", err, logs)
	}
	eventually.True(t, wait, "after run by the same Work", func() bool { _, ok := ran.Load("after"); return ok })
	if !strings.Contains(logs.String(), "rabbitmq reconnected") {
		t.Errorf("no reconnection logged:\n%s", logs)
	}
}

// An outcome decided while the connection goes is kept and applied when
// the message comes back, without running the job again.
func TestOutcomeKeptAcrossLostConnection(t *testing.T) {
	rb := shared.Broker(t)
	b := openBroker(t, rb.URL())
	ctx := context.Background()
	q := b.Queue("kept")
	if err := q.Enqueue(ctx, "job-k", nil); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	var runs atomic.Int64
	started, release := make(chan struct{}, 1), make(chan struct{})
	work(t, q, native(t, `{"max_attempts": 3}`), func(context.Context, queue.Job) error {
		if runs.Add(1) == 1 {
			started <- struct{}{}
			<-release
		}
		return nil
	}, WithMetrics(reg, "default"))
	<-started
	b.mu.Lock()
	conn := b.conn
	b.mu.Unlock()
	conn.Close() // the delivery's channel goes with it; the Broker reconnects
	close(release)
	ch := rb.Channel(t)
	eventually.True(t, wait, "the success applied after the return", func() bool {
		return metric(t, reg, "backstop_attempts_total", map[string]string{"queue": "kept", "job_type": "", "outcome": "success"}) == 1
	})
	eventually.True(t, wait, "the queue empty", func() bool { return depth(t, ch, "kept") == 0 })
	if n := runs.Load(); n != 1 {
		t.Errorf("the job ran %d times, want once", n)
	}
}

func TestKnownIsBounded(t *testing.T) {
	k := newKnown(3)
	for i := range 100 {
		key := fmt.Sprint(i)
		k.put(key, knownMove{published: true})
		if i%2 == 0 {
			if _, ok := k.take(key); !ok {
				t.Fatalf("take(%s) missed", key)
			}
		}
	}
	if len(k.m) > 3 || len(k.order) > 2*3+16 {
		t.Errorf("known holds %d outcomes and %d keys in order, want at most 3 and 22", len(k.m), len(k.order))
	}
	if _, ok := k.take("99"); !ok {
		t.Error("the newest outcome was dropped")
	}
	if _, ok := k.take("1"); ok {
		t.Error("the oldest outcome was kept past the bound")
	}
}

// An outcome whose next message the broker refuses (a negative confirm,
// here a DLQ that a policy fills) is not acked: the delivery goes back to
// the queue, and when it returns the kept outcome is published again,
// without running the job again, until the broker takes it.
func TestRefusedOutcomeIsRetriedWithoutRunningAgain(t *testing.T) {
	rb := shared.Broker(t)
	logs := &logbuf.Buffer{}
	b := openBroker(t, rb.URL(), WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	var ran atomic.Int64
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("ran %d; logs:\n%s", ran.Load(), logs)
		}
	})
	ctx := context.Background()
	// Deliveries handed back count in x-delivery-count: room for many.
	q := b.Queue("refused", WithMaxDeliveries(1_000_000))
	if err := q.Declare(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := rb.Ctl("set_policy", "--apply-to", "queues", "refused-dlq-full", `^refused\.dlq$`,
		`{"max-length":1,"overflow":"reject-publish"}`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := rb.Ctl("clear_policy", "refused-dlq-full"); err != nil {
			t.Error(err)
		}
	})
	ch := rb.Channel(t)
	refusing(t, ch, "refused.dlq")
	// The probes the queue took before the policy reached it stay: a
	// quorum queue refuses once it is over its limit, not at it.
	probes := depth(t, ch, "refused.dlq")
	if err := q.Enqueue(ctx, "job-r", []byte("body")); err != nil {
		t.Fatal(err)
	}
	work(t, q, native(t, `{"max_attempts": 3}`), func(context.Context, queue.Job) error {
		ran.Add(1)
		return &backstop.Failure{HTTPStatus: 400, Err: errors.New("http 400")}
	}, WithConcurrency(1))
	eventually.True(t, wait, "the dead letter to be refused twice", func() bool {
		if strings.Count(logs.String(), "rabbitmq outcome not applied") >= 2 {
			return true
		}
		if depth(t, ch, "refused.dlq") > probes {
			t.Fatalf("refused.dlq took the dead letter (ran %d): the policy does not refuse it", ran.Load())
		}
		return false
	})
	// Room in the DLQ: a quorum queue tells the publishers it refused
	// that it takes messages again once it drops below its limit.
	for range probes {
		d, ok, err := ch.Get("refused.dlq", true)
		if err != nil || !ok || d.MessageId != "probe" {
			t.Fatalf("refused.dlq: got %q (%v, %v), want a probe", d.MessageId, ok, err)
		}
	}
	eventually.True(t, wait, "the dead letter to reach refused.dlq", func() bool { return depth(t, ch, "refused.dlq") > 0 })
	eventually.True(t, wait, "refused to be empty", func() bool { return depth(t, ch, "refused") == 0 })
	dl := takeAll(t, ch, "refused.dlq")
	if len(dl) != 1 || dl[0].MessageId != "job-r" || header(dl[0], HeaderReason) != "permanent_error" {
		t.Fatalf("refused.dlq holds %d dead letters (%v), want job-r once, with reason permanent_error", len(dl), dl)
	}
	if n := ran.Load(); n != 1 {
		t.Errorf("the job ran %d times, want once: a refused outcome is kept, not decided again", n)
	}
}

// An error text over MaxErrorBytes is cut on a character boundary and
// marked with its full length; the marker counts inside the bound.
func TestTruncateError(t *testing.T) {
	if s := strings.Repeat("x", MaxErrorBytes); truncateError(s) != s {
		t.Errorf("an error of exactly %d bytes was changed", MaxErrorBytes)
	}
	for _, s := range []string{strings.Repeat("x", 200_000), strings.Repeat("€", 3000), "a" + strings.Repeat("☃", 5000)} {
		got := truncateError(s)
		marker := fmt.Sprintf(" …[truncated: %d bytes]", len(s))
		if len(got) > MaxErrorBytes || !strings.HasSuffix(got, marker) || !utf8.ValidString(got) ||
			!strings.HasPrefix(s, strings.TrimSuffix(got, marker)) || len(got) < MaxErrorBytes-3 {
			t.Errorf("truncateError(%d bytes) = %d bytes, ends %q", len(s), len(got), got[max(0, len(got)-40):])
		}
	}
}

// A header table over MaxHeaderBytes loses its largest foreign headers
// first, named in backstop-dropped-headers; backstop's own and x-death
// stay; the error headers are truncated.
func TestBoundHeaders(t *testing.T) {
	if n := tableSize(amqp.Table{"ab": "xyz", "n": int64(1), "t": amqp.Table{"k": true}}); n != 4+(1+2+5+3)+(1+1+9)+(1+1+1+4+(1+1+2)) {
		t.Errorf("tableSize = %d", n)
	}
	small := amqp.Table{"a": "b", HeaderAttempt: "1"}
	boundHeaders(small)
	if _, ok := small[HeaderDroppedHeaders]; ok || len(small) != 2 {
		t.Errorf("a small table changed: %v", small)
	}
	h := amqp.Table{
		"big-a": strings.Repeat("a", 40_000), "big-b": []byte(strings.Repeat("b", 30_000)), "small": "s",
		HeaderAttempt: "2", HeaderLastError: strings.Repeat("e", 20_000), "x-death": []any{amqp.Table{"reason": "expired"}},
		HeaderDroppedHeaders: "earlier",
	}
	boundHeaders(h)
	if n := tableSize(h); n > MaxHeaderBytes {
		t.Errorf("bounded table is %d bytes", n)
	}
	if _, ok := h["big-a"]; ok {
		t.Error("the largest foreign header stayed")
	}
	if h["small"] != "s" || h["big-b"] == nil || h[HeaderAttempt] != "2" || h["x-death"] == nil {
		t.Errorf("headers that fit were dropped: %v", h[HeaderDroppedHeaders])
	}
	if h[HeaderDroppedHeaders] != "earlier,big-a" {
		t.Errorf("dropped = %q, want earlier,big-a", h[HeaderDroppedHeaders])
	}
	if len(h[HeaderLastError].(string)) > MaxErrorBytes {
		t.Error("the last error was not truncated")
	}
	// Many foreign headers: the list of names stays within 1024 bytes.
	many := amqp.Table{}
	for i := range 400 {
		many[fmt.Sprintf("header-%03d", i)] = strings.Repeat("v", 1000)
	}
	boundHeaders(many)
	if n, l := tableSize(many), len(many[HeaderDroppedHeaders].(string)); n > MaxHeaderBytes || l > 1024 || l < 900 {
		t.Errorf("400 headers: table %d bytes, dropped list %d bytes", n, l)
	}
}

// A plain message without message_id has no id of its own yet (the worker
// adopts it); the crash-loop count is read on a redelivery only.
func TestDecodePlainWithoutID(t *testing.T) {
	j := Decode(amqp.Delivery{Body: []byte("x")})
	if j.Malformed || j.ID != "" || j.Attempt != 1 {
		t.Errorf("Decode(plain, no message_id) = %+v, want id \"\", attempt 1", j)
	}
	if id := newJobID(); len(id) != 37 || !strings.HasPrefix(id, "amqp-") || strings.Trim(id[5:], "0123456789abcdef") != "" || id == newJobID() {
		t.Errorf("newJobID() = %q", id)
	}
}
