package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/exporter"
	"github.com/backstop-dev/backstop/host"
	"github.com/backstop-dev/backstop/internal/ctxtime"
	"github.com/backstop-dev/backstop/internal/redact"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// demoQueue is one queue of the demo: a policy and a simulated downstream
// with its own failure mix (percent per attempt).
type demoQueue struct {
	name                              string
	policy                            string
	unavailable, throttled, permanent int // 503, 429 with Retry-After, 400
	timeout                           int
}

// The first queue's downstream is the flaky one: a long demo takes it down
// now and then (demoOutage), and its policy's breaker opens.
var demoQueues = []demoQueue{
	{name: "payments", policy: `{"name": "payments", "max_attempts": 4, "max_elapsed": "20s",
		"backoff": {"base": "100ms", "cap": "2s"}, "retry_after": {"cap": "3s", "on_exceed": "give_up"},
		"circuit_breaker": {"failure_threshold": 20, "open_for": "2s"}}`,
		unavailable: 20, throttled: 5, permanent: 3, timeout: 5},
	{name: "emails", policy: `{"name": "emails", "max_attempts": 6,
		"backoff": {"base": "50ms", "cap": "1s"}, "jitter": {"mode": "equal"}}`,
		unavailable: 30, throttled: 10, permanent: 2, timeout: 5},
	{name: "reports", policy: `{"name": "reports", "max_attempts": 8, "uncertain": {"max_attempts": 3},
		"backoff": {"base": "200ms", "cap": "3s"}, "retry_after": {"cap": "5s", "on_exceed": "clamp"}}`,
		unavailable: 15, throttled: 5, permanent: 5, timeout: 10},
}

// policyName is the "name" of the queue's policy file, shown in the view.
func (dq demoQueue) policyName() string {
	var p struct{ Name string }
	json.Unmarshal([]byte(dq.policy), &p)
	return p.Name
}

// downstream answers attempt n of job id: a pure function, so the demo is
// reproducible, except during an outage (down), when every call fails.
func (dq demoQueue) downstream(id string, attempt int64, down bool) error {
	if down {
		return &backstop.Failure{HTTPStatus: 503, Err: errors.New("503 Service Unavailable (outage)")}
	}
	sum := sha256.Sum256(fmt.Appendf(nil, "%s/%s/%d", dq.name, id, attempt))
	v := int(binary.BigEndian.Uint32(sum[:4]) % 100)
	switch {
	case v < dq.permanent:
		return &backstop.Failure{HTTPStatus: 400, Err: errors.New("400 Bad Request")}
	case v < dq.permanent+dq.unavailable:
		return &backstop.Failure{HTTPStatus: 503, Err: errors.New("503 Service Unavailable")}
	case v < dq.permanent+dq.unavailable+dq.throttled:
		return &backstop.Failure{HTTPStatus: 429, RetryAfter: "1", Err: errors.New("429 Too Many Requests")}
	case v < dq.permanent+dq.unavailable+dq.throttled+dq.timeout:
		return &backstop.Failure{ErrorKind: "timeout", Err: context.DeadlineExceeded}
	}
	return nil
}

// Bounds of demo's flags: jobs that still drain in minutes and fit any
// Redis, and no more goroutines (each blocking on a Redis connection) than
// a laptop runs.
const (
	maxDemoJobs    = 1_000_000
	maxDemoWorkers = 64
)

// The endless demo's traffic: a job per queue every demoTrickle, and an
// outage of the first queue's downstream for demoOutageFor every
// demoOutageEvery (long enough for its breaker to open, for retries to pile
// up in the delayed set and for BackstopDLQGrowing to see dead letters).
var (
	demoTrickle     = 100 * time.Millisecond
	demoOutageEvery = 45 * time.Second
	demoOutageFor   = 12 * time.Second
)

// demoEmbeddedHelp ends `backstop demo -h`: what differs on the embedded
// server. demo_embedded_test.go checks each difference on it and on
// redis-server.
const demoEmbeddedHelp = `
Redis: --redis.url, else a redis-server on the PATH (started for the demo), else an embedded
Redis-compatible server (miniredis). The queue scripts are the contract on Redis >= 7; the
embedded server runs them, with these differences:

  DLQ ingestion    XINFO STREAM has no entries-added: backstop_dlq_ingested_total (and the
                   alerter) count the dead letters the queue scripts wrote ({Q}:stats
                   attempts:dead_letter), the same figure while only the scripts write the DLQ.
  stream lag       XINFO GROUPS gives the stream's length as the lag, pending entries
                   included, and no entries-read: backstop_stream_lag_jobs is left out once
                   a group has delivered entries.
  pending          XINFO GROUPS leaves out a pending entry whose data was deleted (XDEL or
                   XTRIM of the jobs stream by hand; the scripts never do): Redis counts it.
  node figures     INFO takes one section, without memory or errorstats, and CLIENT INFO is
                   unknown: backstop_redis_memory_*, backstop_redis_evicted_keys_total and
                   backstop_redis_rejected_writes_total are left out, the node label is the
                   address dialled. No maxmemory: no write is refused, so the workers' resend
                   path never runs.
  deliveries       XCLAIM ... JUSTID counts a delivery (Redis does not): a job a worker holds
                   (hold.lua: its batch waited past half the min idle time, 2.5s here, or
                   Redis refused its outcome) or a crash loop that reclaim skips gets one more
                   delivery each time, so it is dead-lettered as crash_loop sooner (at 5 here).
  deleted entries  XCLAIM leaves a pending entry whose data was deleted pending (Redis drops
                   it); reclaim acks it, so nothing is lost. XCLAIM ignores its min idle time,
                   which reclaim.lua checks with XPENDING IDLE first: no effect.
  payloads         cjson.encode replaces bytes that are not UTF-8 with U+FFFD (Redis keeps
                   them): retry.lua changes such a payload, dead_letter.lua the entry_fields of
                   an entry with over 1000 fields. The demo's payloads are ASCII.

The same on both: TIME, XPENDING delivery counts, idle times and IDLE, redis.pcall error
tables, TYPE, cjson.decode and its numbers. docs/monitoring.md, "Which server gives which figure",
lists the exporter's figures per server.
`

func demo(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlagSet("demo")
	redisURL := fs.String("redis.url", "", "use this Redis (default: a redis-server on PATH, else an embedded Redis-compatible server)")
	jobs := fs.Int("jobs", 0, fmt.Sprintf("enqueue this many jobs at once, spread over the queues (1..%d), and stop when every one is done; default: a steady trickle, with an outage of the payments downstream now and then, until Ctrl-C or --duration", maxDemoJobs))
	listen := fs.String("listen", "127.0.0.1:9797", "address of the exporter's /metrics (this machine only; :9797 for every interface)")
	duration := fs.Duration("duration", 0, "stop after this long (default: at Ctrl-C, or with --jobs when every job is done)")
	workers := fs.Int("workers", 2, fmt.Sprintf("workers per queue (1..%d)", maxDemoWorkers))
	renamed(fs, "redis-url", "redis.url")
	broker := fs.String("broker", "redis", "redis, or rabbitmq: a rabbitmq-server the demo starts (from /usr/lib/rabbitmq/bin or the PATH)")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	finite := false
	fs.Visit(func(f *flag.Flag) { finite = finite || f.Name == "jobs" })
	// Every job is an entry in Redis and every worker a goroutine with a
	// blocking connection: bound both before anything starts.
	if finite && (*jobs < 1 || *jobs > maxDemoJobs) {
		return fmt.Errorf("--jobs: must be in 1..%d (got %d)", maxDemoJobs, *jobs)
	}
	if *workers < 1 || *workers > maxDemoWorkers {
		return fmt.Errorf("--workers: must be in 1..%d (got %d)", maxDemoWorkers, *workers)
	}
	if *duration < 0 {
		return fmt.Errorf("--duration: must be >= 0 (got %s)", *duration)
	}
	switch *broker {
	case "redis":
	case "rabbitmq":
		if *redisURL != "" {
			return fmt.Errorf("%w: --redis.url goes with --broker redis", errUsage)
		}
		// --duration runs from when the broker is up: it takes seconds to start.
		return demoRabbitMQ(ctx, stdout, demoRun{jobs: *jobs, finite: finite, listen: *listen, workers: *workers, duration: *duration})
	default:
		return fmt.Errorf("--broker: must be redis or rabbitmq (got %q)", *broker)
	}
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}

	rdb, where, stop, err := demoRedis(*redisURL)
	if err != nil {
		return err
	}
	defer stop()
	// The intro, kept to be printed again when a resize clears the screen.
	var intro strings.Builder
	out := io.MultiWriter(stdout, &intro)
	if finite {
		fmt.Fprintf(out, "backstop demo: %d jobs on %d queues\n", *jobs, len(demoQueues))
	} else {
		fmt.Fprintf(out, "backstop demo: %d queues, a job on each every %s; payments fails %s in %s\n",
			len(demoQueues), demoTrickle, demoOutageFor, demoOutageEvery)
	}
	fmt.Fprintf(out, "Redis: %s\n", where)
	if *redisURL != "" {
		// Not a Redis of its own: say what it overwrites there.
		var keys []string
		for _, dq := range demoQueues {
			keys = append(keys, "{demo-"+dq.name+"}")
		}
		fmt.Fprintf(out, "the demo deletes and rewrites its keys there: %s, each :jobs, :delayed, :dlq and :stats\n", strings.Join(keys, ", "))
	}

	rt, err := newRuntime(ctx)
	if err != nil {
		return err
	}
	defer rt.Close(context.Background())

	// The queues through the broker-neutral interface, their workers
	// quick to promote and reclaim (a demo's seconds are short). The demo
	// closes rdb itself: the exporter reads it too.
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	br := redisqueue.NewBroker(rdb, redisqueue.WithWorkOptions(redisqueue.WithBatch(16, 100*time.Millisecond),
		redisqueue.WithPromote(50*time.Millisecond, 500), redisqueue.WithReclaim(time.Second, 5*time.Second, 5),
		redisqueue.WithConsumer("demo")))
	var qs []queue.Queue
	var eqs []exporter.Queue
	for _, dq := range demoQueues {
		q, err := br.Open("demo-" + dq.name)
		if err != nil {
			return err
		}
		n := q.Names()
		rdb.Del(ctx, n.Jobs, n.Delayed, n.DLQ, n.Stats)
		qs = append(qs, q)
		eqs = append(eqs, exporter.QueueFor(q.Name()))
	}

	// The exporter, as backstop-exporter would run it.
	collector, err := exporter.NewCollector(rdb, exporter.WithQueues(eqs...), exporter.WithTimeout(5*time.Second))
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collector)
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("--listen %s: %w (choose another with --listen)", *listen, err)
	}
	srv := &http.Server{Handler: demoMetricsHandler(reg)}
	go srv.Serve(ln)
	defer srv.Close()
	fmt.Fprintf(out, "metrics: http://%s/metrics\n", displayAddr(ln.Addr()))
	fmt.Fprint(out, demoInspectHelp("--redis.url", demoRedisURL(rdb, *redisURL), qs[0].Name(), displayAddr(ln.Addr())))

	produced := make([]atomic.Int64, len(qs))
	if finite {
		for i := 0; i < *jobs; i++ {
			k := i % len(qs)
			if _, err := demoEnqueue(ctx, qs[k], k, i/len(qs), fmt.Sprintf("%s-%05d", demoQueues[k].name, i)); err != nil {
				if ctx.Err() != nil {
					break // Ctrl-C while enqueueing: the summary says what was produced
				}
				return err
			}
			produced[k].Add(1)
		}
	}

	wctx, stopWorkers := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var breaker *host.Policy // the payments policy's, shown in the view
	var down atomic.Bool     // the payments downstream is out
	if !finite {
		wg.Add(2)
		go func() { defer wg.Done(); demoProduce(wctx, qs, produced) }()
		go func() { defer wg.Done(); demoOutages(wctx, &down) }()
	}
	for k, q := range qs {
		p, err := rt.Load(ctx, []byte(demoQueues[k].policy))
		if err != nil {
			stopWorkers()
			return err
		}
		if k == 0 {
			breaker = p
		}
		dq := demoQueues[k]
		flaky := k == 0
		o := queue.WorkOptions{Concurrency: *workers, Logger: quiet}
		if k == demoTyped {
			// One stream, three job types: each decided by its own policy.
			if o.Policies, err = demoPolicies(ctx, rt); err != nil {
				stopWorkers()
				return err
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			q.Work(wctx, p, func(ctx context.Context, j queue.Job) error {
				time.Sleep(time.Duration(1+len(j.ID)%4) * time.Millisecond) // the call
				return demoDownstream(k, dq, j, flaky && down.Load())
			}, o)
		}()
	}

	view := newDemoView(stdout, qs, produced, &down)
	view.breaker, view.rdb, view.intro = breaker, rdb, intro.String()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	winch, stopWinch := resized()
	defer stopWinch()
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-tick.C:
			done = view.refresh(ctx) && finite
		case <-winch:
			view.redraw() // the last frame at the new size, at once
		}
	}
	// Ctrl-C (or --duration): the producer and the workers stop; each
	// worker applies the outcome of the job in hand before it returns, so
	// the summary, read after, is the queues' true state.
	stopWorkers()
	wg.Wait()
	view.final(context.Background())
	return nil
}

// demoProduce enqueues a job per queue every demoTrickle until ctx ends.
func demoProduce(ctx context.Context, qs []queue.Queue, produced []atomic.Int64) {
	t := time.NewTicker(demoTrickle)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for k, q := range qs {
			// A failed enqueue (ctx ended meanwhile) is not counted.
			if _, err := demoEnqueue(ctx, q, k, i, fmt.Sprintf("%s-%07d", demoQueues[k].name, i)); err == nil {
				produced[k].Add(1)
			}
		}
	}
}

// demoOutages takes the flaky downstream down for demoOutageFor every
// demoOutageEvery until ctx ends.
func demoOutages(ctx context.Context, down *atomic.Bool) {
	for {
		if !ctxtime.Sleep(ctx, demoOutageEvery-demoOutageFor) {
			return
		}
		down.Store(true)
		ok := ctxtime.Sleep(ctx, demoOutageFor)
		down.Store(false)
		if !ok {
			return
		}
	}
}

// demoMetricsHandler serves the exporter's metrics on /metrics and 404
// on any other path.
func demoMetricsHandler(reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return mux
}

// demoRedisURL is the URL another terminal uses to reach the demo's Redis,
// its password hidden (the user knows it).
func demoRedisURL(rdb redis.UniversalClient, given string) string {
	if given != "" {
		return redact.URL(given)
	}
	if c, ok := rdb.(*redis.Client); ok {
		return "redis://" + c.Options().Addr + "/0"
	}
	return ""
}

// demoInspectHelp tells how to look at the demo's queues from another
// terminal while it runs, with the command as it was started.
func demoInspectHelp(urlFlag, url, q, metrics string) string {
	self := os.Args[0] // as typed: backstop on the PATH, bin/backstop from make demo
	if strings.Contains(self, "go-build") {
		self = "go run ./cmd/backstop"
	}
	return fmt.Sprintf(`
from another terminal, while it runs:
  %[1]s queue stats %[5]s %[2]s --queue %[3]s
  %[1]s dlq inspect %[5]s %[2]s --queue %[3]s
  curl -s http://%[4]s/metrics | grep 'queue="%[3]s"'

`, self, url, q, metrics, urlFlag)
}

// demoRedis returns the Redis the demo uses, what it is, and how to stop it.
func demoRedis(url string) (redis.UniversalClient, string, func(), error) {
	if url != "" {
		opt, err := redis.ParseURL(url)
		if err != nil {
			return nil, "", nil, fmt.Errorf("--redis.url: %w", redact.Error(err, url))
		}
		c := redis.NewClient(opt)
		redis.SetLogger(quietRedis{})
		c.AddHook(&reachHook{addrs: []string{opt.Addr}, flagName: "--redis.url"})
		return c, redact.URL(url), func() { c.Close() }, nil
	}
	if path, err := exec.LookPath("redis-server"); err == nil {
		if c, stop, err := startRedisServer(path); err == nil {
			return c, "redis-server " + c.Options().Addr + " (started for the demo)", stop, nil
		}
	}
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		return nil, "", nil, err
	}
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	return c, "embedded Redis-compatible server (miniredis; install redis-server for the real thing)", func() { c.Close(); m.Close() }, nil
}

func startRedisServer(path string) (*redis.Client, func(), error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir, err := os.MkdirTemp("", "backstop-demo-redis")
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.Command(path, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	// Its own session: the terminal's Ctrl-C reaches the demo, which stops
	// its workers and reads the summary before it stops this server. Should
	// the demo die instead, the server goes with it.
	cmd.SysProcAttr = ownSession()
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(port)})
	stop := func() { c.Close(); cmd.Process.Kill(); cmd.Wait(); os.RemoveAll(dir) }
	for i := 0; c.Ping(context.Background()).Err() != nil; i++ {
		if i > 200 {
			stop()
			return nil, nil, errors.New("redis-server did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return c, stop, nil
}

func displayAddr(a net.Addr) string {
	host, port, _ := net.SplitHostPort(a.String())
	if host == "::" || host == "0.0.0.0" || host == "" {
		host = "localhost"
	}
	return net.JoinHostPort(host, port)
}

// demoView prints the live view: per queue, what is done, queued,
// waiting for a retry, deferred by the breaker and dead, and the retry
// rate; redrawn in place on a terminal, each line cut to its width (80
// columns and up fit every column; wider ones add the policy and the dead
// letters by reason), the screen cleared when the window is resized.
type demoView struct {
	w         io.Writer
	rdb       redis.UniversalClient // nil: no deferred figure (the RabbitMQ view)
	qs        []queue.Queue
	produced  []atomic.Int64
	down      *atomic.Bool
	breaker   *host.Policy
	tty       *os.File // the terminal the view is drawn on, nil when not one
	start     time.Time
	lastRetry []int64
	typeRetry map[string]int64 // the typed queue's attempts:retry per job type
	intro     string           // printed before the first frame: again after a clear
	frame     string           // the last frame drawn, for redraw
	lines     int              // the last frame's lines on the screen
	cols      int              // the terminal's width when it was drawn
}

func newDemoView(w io.Writer, qs []queue.Queue, produced []atomic.Int64, down *atomic.Bool) *demoView {
	v := &demoView{w: w, qs: qs, produced: produced, down: down, start: time.Now(), lastRetry: make([]int64, len(qs))}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			v.tty = f
		}
	}
	return v
}

// size is the terminal's columns and rows, 0, 0 when the view is not on
// one (its lines are then printed whole, a frame after the other).
func (v *demoView) size() (cols, rows int) {
	if v.tty == nil {
		return 0, 0
	}
	return termSize(v.tty)
}

// draw prints a frame (lines ending in "\n") over the last one: each line
// cut to the terminal's width less one column, so that none wraps and the
// cursor goes back up exactly the lines it printed. When the width changed
// (the terminal wraps or reflows the old frame) or the frame is taller than
// the window, the screen is cleared first instead.
func (v *demoView) draw(frame string) {
	cols, rows := v.size()
	var b strings.Builder
	if v.tty != nil && v.lines > 0 {
		if cols != v.cols || v.lines >= rows {
			b.WriteString("\x1b[H\x1b[2J" + v.intro) // home, clear the screen
		} else {
			fmt.Fprintf(&b, "\x1b[%dA\x1b[J", v.lines) // up to the frame's first line, clear below
		}
	}
	lines := strings.SplitAfter(strings.TrimSuffix(frame, "\n"), "\n")
	for _, l := range lines {
		b.WriteString(fitLine(strings.TrimSuffix(l, "\n"), cols-1))
		b.WriteString("\n")
	}
	io.WriteString(v.w, b.String())
	v.frame, v.lines, v.cols = frame, len(lines), cols
}

// redraw draws the last frame again, at the terminal's size now.
func (v *demoView) redraw() {
	if v.frame != "" {
		v.draw(v.frame)
	}
}

// fitLine cuts s to n columns (runes), its last one "…"; n < 1: whole.
func fitLine(s string, n int) string {
	if n < 1 || utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// demoTable lays out the view's rows: the queue, its policy when the
// terminal has 100 columns or more, seven figures 9 wide (80 columns fit
// them: headers of 8 at most), and a last free-form column (dead letters
// by reason).
type demoTable struct {
	b      strings.Builder
	policy bool
}

func newDemoTable(cols int) *demoTable { return &demoTable{policy: cols == 0 || cols >= 100} }

func (t *demoTable) row(name, policy string, figures []string, rest string) {
	fmt.Fprintf(&t.b, "%-15s", name)
	if t.policy {
		fmt.Fprintf(&t.b, " %-10s", policy)
	}
	for _, f := range figures {
		fmt.Fprintf(&t.b, " %8s", f)
	}
	if rest != "" {
		t.b.WriteString("  " + rest)
	}
	t.b.WriteString("\n")
}

func (t *demoTable) line(format string, a ...any) { fmt.Fprintf(&t.b, format+"\n", a...) }

// n is a figure of the view.
func n(v int64) string { return strconv.FormatInt(v, 10) }

// demoDeferMax bounds the delayed members the view reads each second to
// count the deferred ones: a demo's delayed sets are small; past it the
// count is a lower bound, shown with a "+".
const demoDeferMax = 2000

// deferred counts the queue's delayed jobs that the breaker (or the
// budget) deferred rather than a failure delayed: their member's
// last_reason is circuit_open or budget_exhausted (contract/scripts/defer.lua).
func (v *demoView) deferred(ctx context.Context, q queue.Queue) string {
	if v.rdb == nil {
		return "-"
	}
	members, err := v.rdb.ZRange(ctx, q.Names().Delayed, 0, demoDeferMax-1).Result()
	if err != nil {
		return "?"
	}
	var d int64
	for _, m := range members {
		var j struct {
			LastReason string `json:"last_reason"`
		}
		if json.Unmarshal([]byte(m), &j) == nil && (j.LastReason == "circuit_open" || j.LastReason == "budget_exhausted") {
			d++
		}
	}
	if len(members) == demoDeferMax {
		return n(d) + "+"
	}
	return n(d)
}

// demoColumns are the figures' headers: produced; succeeded; queued (in
// the jobs stream: waiting or running); retrying (in the delayed set for a
// retry); deferred (in the delayed set, put back by the breaker without
// spending an attempt); retries per second; dead letters.
var demoColumns = []string{"produced", "success", "queued", "retrying", "deferred", "retry/s", "dead"}

// refresh prints one frame and reports whether every job is done.
func (v *demoView) refresh(ctx context.Context) bool {
	cols, _ := v.size()
	t := newDemoTable(cols)
	t.row("queue", "policy", demoColumns, "dead letters by reason")
	drained := true
	for i, q := range v.qs {
		produced := v.produced[i].Load()
		s, err := q.Stats(ctx)
		if err != nil {
			t.line("%-15s stats: %v", q.Name(), err)
			drained = false
			continue
		}
		c := s.Counters
		rate := c["attempts:retry"] - v.lastRetry[i]
		v.lastRetry[i] = c["attempts:retry"]
		deferred := v.deferred(ctx, q)
		d, _ := strconv.ParseInt(strings.TrimSuffix(deferred, "+"), 10, 64)
		t.row(q.Name(), demoQueues[i].policyName(), []string{n(produced), n(c["attempts:success"]), n(s.Jobs),
			n(max(delayedOf(s)-d, 0)), deferred, n(rate), n(s.DeadLetters)}, byReason(c))
		if r, ok := s.Raw.(redisqueue.Stats); ok && i == demoTyped {
			if v.typeRetry == nil {
				v.typeRetry = map[string]int64{}
			}
			demoTypeLines(t, r.Types, v.typeRetry, demoQueues[i].policyName())
		}
		if c["attempts:success"]+c["attempts:dead_letter"] < produced {
			drained = false
		}
	}
	state := "up"
	if v.down.Load() {
		state = "DOWN (an outage)"
	}
	if v.breaker != nil {
		if cs, err := v.breaker.CircuitState(ctx, time.Now().UnixMilli()); err == nil {
			state += ", its breaker " + cs.String()
			if cs != policy.BreakerClosed {
				state += ": jobs deferred"
			}
		}
	}
	t.line("payments downstream: %s", state)
	t.line("elapsed %s   (Ctrl-C stops)", time.Since(v.start).Round(time.Second))
	v.draw(t.b.String())
	return drained
}

// delayedOf is a queue's delayed jobs, 0 when its broker cannot count them.
func delayedOf(s queue.Stats) int64 {
	if s.Delayed == nil {
		return 0
	}
	return *s.Delayed
}

func byReason(c map[string]int64) string {
	var parts []string
	for k, n := range c {
		if r, ok := strings.CutPrefix(k, "dead_letters:"); ok {
			parts = append(parts, fmt.Sprintf("%s=%d", r, n))
		}
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

// final prints the summary: what became of the jobs produced, and what
// is left where (jobs delayed or deferred are waiting, not in flight).
func (v *demoView) final(ctx context.Context) {
	var produced, ok, dead, retries, queued, delayed, deferred int64
	for i, q := range v.qs {
		s, err := q.Stats(ctx)
		if err != nil {
			continue
		}
		produced += v.produced[i].Load()
		ok += s.Counters["attempts:success"]
		dead += s.Counters["attempts:dead_letter"]
		retries += s.Counters["attempts:retry"]
		queued += s.Jobs
		d, _ := strconv.ParseInt(strings.TrimSuffix(v.deferred(ctx, q), "+"), 10, 64)
		delayed += delayedOf(s) - d
		deferred += d
	}
	fmt.Fprintf(v.w, "\nsummary: %d produced, %d succeeded, %d dead-lettered, %d retries in %s\n",
		produced, ok, dead, retries, time.Since(v.start).Round(100*time.Millisecond))
	if left := produced - ok - dead; left > 0 {
		fmt.Fprintf(v.w, "not finished: %d: %d queued, %d waiting for a retry, %d deferred by the breaker\n",
			left, queued, delayed, deferred)
	}
}
