package rabbitmq

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/internal/ctxtime"
	"github.com/backstop-dev/backstop/internal/queuemetrics"
	"github.com/backstop-dev/backstop/queue"
)

// WorkOption configures Work.
type WorkOption func(*workConfig)

type workConfig struct {
	prefetch       int
	concurrency    int // 0: as the prefetch
	tag            string
	concurrencySet bool
	metricsReg     prometheus.Registerer
	metricsPolicy  string
	policies       map[string]backstop.Decider
	hook           queue.OutcomeHook
	handlerTimeout time.Duration
	applyTimeout   time.Duration // per attempt at publishing and acking an outcome
	known          int           // outcomes kept across a lost channel
	noMover        bool          // tests that look at the levels: nothing moves them
	log            *slog.Logger  // the Runner's (nil: the Broker's): queue.WorkOptions.Logger
}

// WithPrefetch sets how many unacked deliveries the broker sends this
// worker ahead (basic.qos, default 16), and so how many outcomes may wait
// for their confirms at once; it is also the default concurrency.
func WithPrefetch(n int) WorkOption { return func(c *workConfig) { c.prefetch = n } }

// WithConcurrency sets how many jobs run at once (default: the prefetch,
// as the Node and Python workers do: handlers mostly wait on I/O, and a
// job in hand that does not run only waits). It should not exceed the
// prefetch. WithConcurrency(1) runs one job at a time; its outcome is
// still applied while the next job runs.
func WithConcurrency(n int) WorkOption {
	return func(c *workConfig) { c.concurrency, c.concurrencySet = n, true }
}

// WithHandlerTimeout bounds each run of the handler (default 5m), as
// redisqueue.WithHandlerTimeout does for Redis: the handler's ctx carries the
// deadline, and at the deadline the attempt fails with a deadline error,
// error kind timeout, decided by the policy (retried through the delay
// levels, or dead-lettered). A handler that ignores its ctx is left
// running, logged once; the worker applies the outcome. Work refuses
// d <= 0.
//
// Keep it below the broker's consumer_timeout (30m by default on
// RabbitMQ 3.10 and later): past that, the broker closes the channel of a
// delivery not acked, and delivers the job again (README, "Deadlines").
func WithHandlerTimeout(d time.Duration) WorkOption {
	return func(c *workConfig) { c.handlerTimeout = d }
}

// WithConsumerTag names this worker's consumer (default
// hostname-pid-queue, with a number the broker makes unique).
func WithConsumerTag(tag string) WorkOption { return func(c *workConfig) { c.tag = tag } }

// WithMetrics counts the worker's outcomes in reg: the backstop_client_*
// families, labelled policy=policyName and target=the queue (as the Redis
// worker's redisqueue.WithMetrics), and the queue families the exporter gives
// Redis queues (backstop_attempts_total, backstop_retries_total,
// backstop_deferrals_total, backstop_dead_letters_total,
// backstop_max_attempts_reached_total, backstop_job_attempts), labelled
// queue and job_type (README, "Counters and metrics"), since the broker
// cannot count outcomes by reason. The queue families count an outcome
// once the broker has it (published and acked).
func WithMetrics(reg prometheus.Registerer, policyName string) WorkOption {
	return func(c *workConfig) { c.metricsReg, c.metricsPolicy = reg, policyName }
}

// WithPolicies decides the jobs of some job types by their own policy, as
// redisqueue.WithPolicies does for Redis (see queue.WithPolicies).
func WithPolicies(m map[string]backstop.Decider) WorkOption {
	return func(c *workConfig) { c.policies = m }
}

// WithOutcomeHook has Work call h with every outcome it applies (the next
// message confirmed and the delivery acked), as queue.WithOutcomeHook says:
// for per-job alerting, such as paging on a dead letter of one job type.
func WithOutcomeHook(h queue.OutcomeHook) WorkOption {
	return func(c *workConfig) { c.hook = h }
}

// Work consumes the queue until ctx is done. For each delivery it applies
// the README's moves: it runs h (after asking the policy's breaker) and
// publishes the next message — a retry or a deferral to Q.delay, a dead
// letter to Q.dlq — with publisher confirms, and only then acks the
// delivery; a confirm is awaited with no timeout while the channel lives
// (a memory alarm only delays it). A malformed delivery is dead-lettered
// (malformed; so is one due more than MaxDueAhead ahead), a redelivery
// delivered max-deliveries times already (x-delivery-count) as a crash
// loop without running, one that arrives before its backstop-due-ms is
// delayed again for the remainder, and a plain message without message_id
// is first adopted (published again with an id of its own). Error texts
// and header tables are bounded below the broker's frame_max (README,
// "Headers").
//
// While it runs, it also moves delayed messages down the delay levels
// (README, "The moves between levels are the workers'"), for every queue of
// the virtual host.
//
// On shutdown (ctx done) it cancels its consumer, lets the running jobs
// finish and applies their outcomes, and returns nil; deliveries not
// started go back to the queue. While the connection is lost it waits for
// the Broker's reconnection and consumes again; an outcome decided but not
// yet applied when the channel went is kept (by job id and attempt, at most
// 10,000) and applied when the message comes back, without running the job
// again.
//
// # Notes
//
// queue.Job's EntryID is empty: a delivery tag means nothing outside its
// channel. The handler's ctx is Work's with the handler's deadline
// (WithHandlerTimeout): a handler that honours it stops at shutdown, and
// its failure is decided as any other. The connection's heartbeats run on
// their own while a handler runs, however long: a job is not delivered
// again for that. When the breaker refuses a job it is deferred
// (circuit_open) and the worker starts no job until the breaker may
// half-open. A delivery the worker did not start
// before shutdown or a crash goes back to the queue, and RabbitMQ 3.10
// counts that in its x-delivery-count too.
//
// # Errors
//
// Invalid options, before the broker (a prefetch or concurrency below 1, a
// handler timeout not positive, WithMetrics' errors as queue.WithMetrics');
// ErrClosed when the Broker is closed; a topology the broker refuses
// (Declare's errors).
func (q *Queue) Work(ctx context.Context, p backstop.Decider, h queue.Handler, opts ...WorkOption) error {
	host, _ := os.Hostname()
	c := workConfig{prefetch: 16, tag: host + "-" + strconv.Itoa(os.Getpid()) + "-" + q.name,
		handlerTimeout: 5 * time.Minute, applyTimeout: 10 * time.Second, known: 10_000}
	for _, o := range opts {
		o(&c)
	}
	if !c.concurrencySet {
		c.concurrency = c.prefetch
	}
	if err := q.validate(); err != nil {
		return err
	}
	switch {
	case c.prefetch < 1:
		return fmt.Errorf("rabbitmq: work %s: WithPrefetch: must be at least 1, got %d", q.name, c.prefetch)
	case c.concurrency < 1:
		return fmt.Errorf("rabbitmq: work %s: WithConcurrency: must be at least 1, got %d", q.name, c.concurrency)
	case c.handlerTimeout <= 0:
		return fmt.Errorf("rabbitmq: work %s: WithHandlerTimeout: must be positive, got %v", q.name, c.handlerTimeout)
	case p == nil:
		return fmt.Errorf("rabbitmq: work %s: decider: must not be nil", q.name)
	case h == nil:
		return fmt.Errorf("rabbitmq: work %s: handler: must not be nil", q.name)
	}
	if c.log == nil {
		c.log = q.b.cfg.log
	}
	ropts := []queue.Option{queue.WithLogger(c.log), queue.WithHandlerTimeout(c.handlerTimeout)}
	if c.policies != nil {
		ropts = append(ropts, queue.WithPolicies(c.policies))
	}
	if c.hook != nil {
		ropts = append(ropts, queue.WithOutcomeHook(c.hook))
	}
	w := &worker{q: q, cfg: c, h: h, known: newKnown(c.known)}
	if c.metricsReg != nil || c.metricsPolicy != "" {
		ropts = append(ropts, queue.WithMetrics(c.metricsReg, c.metricsPolicy))
		m, err := queuemetrics.Bind(c.metricsReg, q.name, "rabbitmq: WithMetrics")
		if err != nil {
			return err
		}
		w.metrics = m
	}
	r, err := queue.NewRunner(q.name, p, ropts...)
	if err != nil {
		return err
	}
	w.runner = r
	// The delay levels' moves (mover.go): for the jobs this worker and every
	// other worker of the virtual host delay.
	mctx, stopMover := context.WithCancel(ctx)
	moved := make(chan struct{})
	go func() {
		defer close(moved)
		if !c.noMover {
			q.move(mctx)
		}
	}()
	defer func() {
		stopMover()
		<-moved
	}()
	pause := 50 * time.Millisecond
	for n := 0; ; n++ {
		err := w.session(ctx, n)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, ErrClosed) {
			return err
		}
		var aerr *amqp.Error
		if errors.As(err, &aerr) && aerr.Code == amqp.PreconditionFailed {
			return fmt.Errorf("rabbitmq: work %s: %w", q.name, err)
		}
		q.b.cfg.log.Warn("rabbitmq consumer lost; consuming again", "queue", q.name, "err", err)
		if !ctxtime.Sleep(ctx, pause) {
			return nil
		}
		pause = min(2*pause, 2*time.Second)
	}
}

type worker struct {
	q       *Queue
	cfg     workConfig
	h       queue.Handler
	runner  *queue.Runner
	metrics *queuemetrics.Recorder // nil: none
	known   *known
}

// session consumes on one channel until ctx is done (nil) or the channel
// is lost (its error).
func (w *worker) session(ctx context.Context, n int) error {
	q := w.q
	if err := q.Declare(ctx); err != nil {
		return err
	}
	ch, _, err := q.b.channel(ctx)
	if err != nil {
		return err
	}
	defer ch.Close() // returns the deliveries not started
	lost := ch.NotifyClose(make(chan *amqp.Error, 1))
	if err := ch.Qos(w.cfg.prefetch, 0, false); err != nil {
		return err
	}
	tag := w.cfg.tag
	if n > 0 {
		tag += "-" + strconv.Itoa(n) // the old consumer may not be gone yet
	}
	deliveries, err := ch.Consume(q.name, tag, false, false, false, false, nil)
	if err != nil {
		return err
	}
	acks := make(chan pending, w.cfg.prefetch)
	acked := make(chan struct{})
	// Confirms are awaited while ch lives, and at shutdown up to the apply
	// timeout.
	grace, stopGrace := afterGrace(ctx, w.cfg.applyTimeout)
	defer stopGrace()
	go func() {
		defer close(acked)
		w.acker(grace, ch, acks)
	}()
	// After the handlers (below): the outcomes they published are
	// confirmed and acked before ch closes.
	defer func() {
		close(acks)
		<-acked
	}()
	jobs := make(chan amqp.Delivery)
	var wg sync.WaitGroup
	for range w.cfg.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for d := range jobs {
				// Checked here, not only before the dispatch: a job that
				// ran meanwhile may have opened the breaker.
				if !w.waitPause(ctx) {
					continue // not started: back to the queue when ch closes
				}
				w.handle(ctx, ch, d, acks)
			}
		}()
	}
	defer wg.Wait()
	defer close(jobs)
	for {
		if !w.waitPause(ctx) {
			ch.Cancel(tag, false)
			return nil
		}
		select {
		case <-ctx.Done():
			ch.Cancel(tag, false)
			return nil
		case err := <-lost:
			if err == nil {
				return amqp.ErrClosed
			}
			return err
		case d, ok := <-deliveries:
			if !ok {
				return amqp.ErrClosed
			}
			select {
			case jobs <- d:
			case <-ctx.Done():
				ch.Cancel(tag, false)
				return nil
			}
		}
	}
}

// waitPause waits while the breaker refuses jobs (it refused one, or a
// failure found it open): no job starts until it may half-open. It
// reports false when ctx is done first.
func (w *worker) waitPause(ctx context.Context) bool {
	for {
		d := time.Until(w.runner.PausedUntil())
		if d <= 0 {
			return ctx.Err() == nil
		}
		if !ctxtime.Sleep(ctx, d) {
			return false
		}
	}
}

// move is what to do with a delivery.
type move struct {
	queue.Outcome
	early bool // due in the future: delayed again for the remainder, counted nowhere
	adopt bool // plain without message_id: published again with an id of its own, counted nowhere
}

// handle decides one delivery's move and publishes its next message; the
// acker (acks) waits for that message's confirm and then acks d.
func (w *worker) handle(ctx context.Context, ch *amqp.Channel, d amqp.Delivery, acks chan<- pending) {
	j := Decode(d)
	key := j.ID + "\x00" + strconv.FormatInt(j.Attempt, 10)
	p := pending{d: d, j: j, key: key}
	published := false
	if k, ok := w.known.take(key); ok && !j.Malformed && j.ID != "" {
		// Decided before the channel went: apply it, do not run again.
		p.m, published, p.refusals = k.m, k.published, k.refusals
	} else {
		p.m = w.decide(ctx, d, j)
	}
	// Outcomes are applied even during shutdown.
	p.deadline = time.Now().Add(w.cfg.applyTimeout)
	if !published {
		actx, cancel := context.WithDeadline(context.WithoutCancel(ctx), p.deadline)
		err := w.publishNext(actx, ch, &p)
		cancel()
		if err != nil {
			w.refused(ch, p, err)
			return
		}
	}
	acks <- p
}

// decide is what to do with delivery d of job j: adopt it (plain without
// message_id), dead-letter it (malformed, a crash loop, a due time past
// MaxDueAhead), delay it again (early), or run it.
func (w *worker) decide(ctx context.Context, d amqp.Delivery, j queue.Job) move {
	if j.Malformed {
		return move{Outcome: queue.Outcome{Action: "dead_letter", Reason: "malformed", LastError: MalformedError}}
	}
	if j.ID == "" { // plain, without message_id: Decode
		return move{adopt: true}
	}
	// x-delivery-count is the broker's only on a redelivery: on a first
	// delivery it is a copy (a shovel's, another publisher's).
	if n, _, ok := headerDigits(d.Headers["x-delivery-count"]); ok && d.Redelivered {
		if o, loop := w.runner.Delivered(ctx, j, n, int64(w.q.maxDeliveries)); loop {
			o.LastError = fmt.Sprintf("crash loop: delivered %d times without an outcome (max deliveries %d)", n+1, w.q.maxDeliveries)
			return move{Outcome: o}
		}
	}
	if due := dueMs(d.Headers); due > 0 {
		if due > time.Now().Add(MaxDueAhead).UnixMilli() {
			return move{Outcome: queue.Outcome{Action: "dead_letter", Reason: "malformed", LastError: DueTooFarError}}
		}
		if rest := time.Until(time.UnixMilli(due)); rest > 0 {
			return move{Outcome: queue.Outcome{Action: "defer", Delay: rest}, early: true}
		}
	}
	return move{Outcome: w.runner.Run(ctx, w.h, j)}
}

// pending is an outcome on its way: its next message published (dc; nil
// when there is none, or it was confirmed on a channel that went since),
// the delivery not yet acked.
type pending struct {
	d        amqp.Delivery
	j        queue.Job
	key      string // job id and attempt, for known
	m        move
	dc       *amqp.DeferredConfirmation
	dest     string    // "exchange %q, key %q", for a rejection's error
	deadline time.Time // for the publish; for the confirm once the worker stops
	refusals int       // how often the broker refused this outcome's next message before
}

// acker applies the outcomes handle sends, in order: it waits for each
// next message's confirm and only then acks the delivery. Confirms are
// pipelined: the handlers go on to the next deliveries (as many as the
// prefetch lets the broker send) while the broker syncs the messages
// already published, instead of one round trip and one disk sync per job.
// When the channel is lost first, an outcome is kept for the message's
// return. A confirm is waited for with no timeout while ch lives (a
// blocked connection only delays it: README, "A confirm is never timed
// out"), until grace is done (shutdown plus the apply timeout) and the
// outcome's own apply timeout has passed.
func (w *worker) acker(grace context.Context, ch *amqp.Channel, acks <-chan pending) {
	for p := range acks {
		if p.dc != nil {
			// A job that finished after the shutdown still has its apply
			// timeout from its decision.
			ctx, cancel := context.WithCancel(context.Background())
			stop := context.AfterFunc(grace, func() { time.AfterFunc(time.Until(p.deadline), cancel) })
			err := waitConfirm(ctx, ch, p.dc)
			stop()
			cancel()
			if errors.Is(err, ErrRejected) {
				err = fmt.Errorf("%w: %s of job %q to %s", err, p.m.Action, p.j.ID, p.dest)
			}
			if err != nil {
				w.refused(ch, p, err)
				continue
			}
		}
		if err := p.d.Ack(false); err != nil {
			w.keep(p.key, p.m, true, p.j, err, 0)
			continue
		}
		w.count(p.j, p.m)
		if !p.m.early && !p.m.adopt {
			w.runner.Applied(grace, p.j, p.m.Outcome)
		}
	}
}

// refused keeps p's outcome, whose next message the broker does not have,
// for the message's return.
func (w *worker) refused(ch *amqp.Channel, p pending, err error) {
	n := p.refusals + 1
	w.keep(p.key, p.m, false, p.j, err, n)
	if !ch.IsClosed() {
		// Refused (a full delay level or DLQ) or unconfirmed: hand the
		// message back, to be tried again when it returns (the broker's
		// delivery limit bounds that), rather than hold it unacked for as
		// long as the channel lives; but not at once. While a cluster
		// elects the new leader of a level, it refuses the move again and
		// again, and each return counts in x-delivery-count: handed back
		// at once, a job's deliveries ran out in seconds and it was
		// dead-lettered as a crash loop (TestClusterCrashLosesNothing).
		time.AfterFunc(refusedPause(n), func() { _ = p.d.Nack(false, true) })
	}
}

// refusedPause is how long a delivery whose outcome the broker refused n
// times in a row waits before it is handed back: 20ms doubling to 5s,
// jittered (half to all of it).
func refusedPause(n int) time.Duration {
	d := min(5*time.Second, 20*time.Millisecond<<min(n-1, 10))
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

// keep keeps outcome m of job j for the message's return: its next
// message published or not, and refused by the broker the n-th time in a
// row (0: not refused; the channel went).
func (w *worker) keep(key string, m move, published bool, j queue.Job, err error, n int) {
	if !j.Malformed && j.ID != "" { // an adoption is done again: its key is no job's
		w.known.put(key, knownMove{m: m, published: published, refusals: n})
	}
	w.q.b.cfg.log.Warn("rabbitmq outcome not applied; kept for the message's return", "queue", w.q.name,
		"job", j.ID, "attempt", j.Attempt, "action", m.Action, "published", published, "err", err)
}

// publishNext publishes the message an outcome moves p.d to (nothing for
// an ack) and sets p.dc to its confirm, not waiting for it.
func (w *worker) publishNext(ctx context.Context, ch *amqp.Channel, p *pending) error {
	q, d, j, m := w.q, p.d, p.j, p.m
	now := time.Now().UnixMilli()
	var exchange, key string
	var msg amqp.Publishing
	if m.adopt {
		// The same message with an id of its own, at the back of Q: run
		// as attempt 1 when it comes (still plain).
		msg = next(d, nil, false)
		msg.MessageId = newJobID()
		p.dest = fmt.Sprintf("exchange \"\", key %q", q.name)
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q.name, false, false, msg)
		p.dc = dc
		return err
	}
	switch m.Action {
	case "ack":
		return nil
	case "retry", "defer":
		set := map[string]any{HeaderDestination: q.name}
		// An early message keeps its due time: now + the remainder
		// truncated to ms would move it a ms earlier.
		if !m.early {
			set[HeaderDueMs] = itoa(now + m.Delay.Milliseconds())
			set[HeaderLastReason] = m.Reason
			if m.LastError != "" {
				set[HeaderLastError] = m.LastError
			}
		}
		if m.Action == "retry" {
			set[HeaderAttempt] = itoa(j.Attempt + 1)
			set[HeaderPrevDelayMs] = itoa(m.Delay.Milliseconds())
		}
		exchange, key = NamesFor(q.name).Delay, delayRoutingKey(delaySeconds(m.Delay))
		msg = next(d, set, true)
	default: // dead_letter
		set := map[string]any{HeaderReason: m.Reason, HeaderError: m.LastError, HeaderDeadLetteredMs: itoa(now)}
		if _, ok := d.Headers[HeaderDestination]; !ok && !j.Malformed {
			set[HeaderDestination] = q.name
		}
		exchange, key = "", NamesFor(q.name).DLQ
		msg = next(d, set, !j.Malformed)
	}
	if plain(d.Headers) {
		// The next delivery is a backstop job: the id and first-enqueued
		// time Decode gave this one (a plain message has no other).
		msg.MessageId = j.ID
		msg.Headers[HeaderFirstEnqueuedMs] = itoa(j.FirstEnqueuedMs)
		if _, ok := msg.Headers[HeaderAttempt]; !ok {
			msg.Headers[HeaderAttempt] = itoa(j.Attempt)
		}
	}
	p.dest = fmt.Sprintf("exchange %q, key %q", exchange, key)
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, false, false, msg)
	p.dc = dc
	return err
}

// count records an applied outcome in the queue families.
func (w *worker) count(j queue.Job, m move) {
	if w.metrics == nil || m.early || m.adopt {
		return
	}
	mj := queuemetrics.Job{Type: j.Type, ValidType: queue.ValidJobType(j.Type) == nil, Attempt: j.Attempt}
	if j.Malformed || m.Reason == "malformed" { // a due time past the bound too
		mj.Attempt = 0
	}
	switch m.Action {
	case "ack":
		w.metrics.Success(mj)
	case "retry":
		w.metrics.Retried(mj, m.Reason)
	case "defer":
		w.metrics.Deferred(mj, m.Reason)
	default:
		w.metrics.DeadLettered(mj, m.Reason)
	}
}

// known holds outcomes decided but not applied (the channel went first),
// by job id and attempt, oldest dropped past its size.
type known struct {
	mu    sync.Mutex
	max   int
	m     map[string]knownMove
	order []string
}

type knownMove struct {
	m         move
	published bool // the next message is confirmed: only the ack is left
	refusals  int  // the broker refused the next message this many times in a row
}

func newKnown(max int) *known { return &known{max: max, m: map[string]knownMove{}} }

func (k *known) put(key string, v knownMove) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.m[key]; !ok {
		k.order = append(k.order, key)
	}
	k.m[key] = v
	for len(k.m) > k.max && len(k.order) > 0 {
		delete(k.m, k.order[0])
		k.order = k.order[1:]
	}
	if len(k.order) > 2*k.max+16 {
		// Keys taken since stay in order: drop them, keeping the age order.
		live := k.order[:0]
		seen := make(map[string]bool, len(k.m))
		for _, key := range k.order {
			if _, ok := k.m[key]; ok && !seen[key] {
				seen[key] = true
				live = append(live, key)
			}
		}
		k.order = live
	}
}

func (k *known) take(key string) (knownMove, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	v, ok := k.m[key]
	if ok {
		delete(k.m, key)
		// order keeps the key until put compacts it.
	}
	return v, ok
}

// newJobID is the id a plain message without message_id is adopted with:
// "amqp-" and 32 random lowercase hex digits.
func newJobID() string {
	var b [16]byte
	for i := range b {
		b[i] = byte(rand.Uint32())
	}
	return "amqp-" + hex.EncodeToString(b[:])
}
