package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/exporter"
	"github.com/backstop-dev/backstop/host"
	"github.com/backstop-dev/backstop/queue"
)

// demoQueue is one queue of the demo: a policy and a simulated downstream
// with its own failure mix (percent per attempt).
type demoQueue struct {
	name                              string
	policy                            string
	unavailable, throttled, permanent int // 503, 429 with Retry-After, 400
	timeout                           int
}

var demoQueues = []demoQueue{
	{name: "payments", policy: `{"name": "payments", "max_attempts": 4, "max_elapsed": "20s",
		"backoff": {"base": "100ms", "cap": "2s"}, "retry_after": {"cap": "3s", "on_exceed": "give_up"}}`,
		unavailable: 20, throttled: 5, permanent: 3, timeout: 5},
	{name: "emails", policy: `{"name": "emails", "max_attempts": 6,
		"backoff": {"base": "50ms", "cap": "1s"}, "jitter": {"mode": "equal"}}`,
		unavailable: 30, throttled: 10, permanent: 2, timeout: 5},
	{name: "reports", policy: `{"name": "reports", "max_attempts": 8, "uncertain": {"max_attempts": 3},
		"backoff": {"base": "200ms", "cap": "3s"}, "retry_after": {"cap": "5s", "on_exceed": "clamp"}}`,
		unavailable: 15, throttled: 5, permanent: 5, timeout: 10},
}

// downstream answers attempt n of job id: a pure function, so the demo is
// reproducible.
func (dq demoQueue) downstream(id string, attempt int64) error {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s/%s/%d", dq.name, id, attempt))
	v := int(binary.BigEndian.Uint32(sum[:4]) % 100)
	switch {
	case v < dq.permanent:
		return &queue.Failure{HTTPStatus: 400, Err: errors.New("400 Bad Request")}
	case v < dq.permanent+dq.unavailable:
		return &queue.Failure{HTTPStatus: 503, Err: errors.New("503 Service Unavailable")}
	case v < dq.permanent+dq.unavailable+dq.throttled:
		return &queue.Failure{HTTPStatus: 429, RetryAfter: "1", Err: errors.New("429 Too Many Requests")}
	case v < dq.permanent+dq.unavailable+dq.throttled+dq.timeout:
		return &queue.Failure{ErrorKind: "timeout", Err: context.DeadlineExceeded}
	}
	return nil
}

func demo(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	redisURL := fs.String("redis-url", "", "use this Redis (default: a redis-server on PATH, else an embedded Redis-compatible server)")
	jobs := fs.Int("jobs", 3000, "jobs to enqueue, spread over the queues")
	listen := fs.String("listen", ":9797", "address of the exporter's /metrics")
	duration := fs.Duration("duration", 0, "stop after this long (default: when every job is done)")
	workers := fs.Int("workers", 2, "workers per queue")
	if err := fs.Parse(args); err != nil || fs.NArg() != 0 {
		return errUsage
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
	fmt.Fprintf(stdout, "backstop demo: %d jobs on %d queues, Redis: %s\n", *jobs, len(demoQueues), where)

	cache, _ := os.UserCacheDir()
	rt, err := host.New(ctx, host.WithCompilationCache(filepath.Join(cache, "backstop", "wazero")))
	if err != nil {
		return err
	}
	defer rt.Close(context.Background())

	var qs []*queue.Queue
	var eqs []exporter.Queue
	for _, dq := range demoQueues {
		q := queue.New(rdb, "demo-"+dq.name)
		rdb.Del(ctx, q.Keys().Jobs, q.Keys().Delayed, q.Keys().DLQ, q.Keys().Stats)
		if err := q.EnsureGroup(ctx); err != nil {
			return err
		}
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
	srv := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{})}
	go srv.Serve(ln)
	defer srv.Close()
	fmt.Fprintf(stdout, "metrics: http://%s/metrics\n\n", displayAddr(ln.Addr()))

	produced := make([]int64, len(qs))
	for i := 0; i < *jobs; i++ {
		k := i % len(qs)
		if _, err := qs[k].Enqueue(ctx, fmt.Sprintf("%s-%05d", demoQueues[k].name, i), []byte(`{"demo":true}`)); err != nil {
			return err
		}
		produced[k]++
	}

	wctx, stopWorkers := context.WithCancel(ctx)
	var wg sync.WaitGroup
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for k, q := range qs {
		p, err := rt.Load(ctx, []byte(demoQueues[k].policy))
		if err != nil {
			stopWorkers()
			return err
		}
		dq := demoQueues[k]
		for w := 0; w < *workers; w++ {
			wg.Add(1)
			go func(q *queue.Queue, w int) {
				defer wg.Done()
				q.Work(wctx, p, func(ctx context.Context, j queue.Job) error {
					time.Sleep(time.Duration(1+len(j.ID)%4) * time.Millisecond) // the call
					return dq.downstream(j.ID, j.Attempt)
				}, queue.WithConsumer(fmt.Sprintf("demo-%d", w)), queue.WithBatch(16, 100*time.Millisecond),
					queue.WithPromote(50*time.Millisecond, 500), queue.WithReclaim(time.Second, 5*time.Second, 5),
					queue.WithLogger(quiet))
			}(q, w)
		}
	}

	view := newDemoView(stdout, qs, produced)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-tick.C:
			done = view.refresh(ctx)
		}
	}
	stopWorkers()
	wg.Wait()
	view.final(context.Background())
	return nil
}

// demoRedis returns the Redis the demo uses, what it is, and how to stop it.
func demoRedis(url string) (redis.UniversalClient, string, func(), error) {
	if url != "" {
		opt, err := redis.ParseURL(url)
		if err != nil {
			return nil, "", nil, fmt.Errorf("--redis-url: %w", err)
		}
		c := redis.NewClient(opt)
		return c, url, func() { c.Close() }, nil
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
	if err := cmd.Start(); err != nil {
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

// demoView prints the live view: per queue, what is done, retrying,
// delayed and dead, and the retry rate.
type demoView struct {
	w         io.Writer
	qs        []*queue.Queue
	produced  []int64
	tty       bool
	start     time.Time
	lastRetry []int64
	lines     int
}

func newDemoView(w io.Writer, qs []*queue.Queue, produced []int64) *demoView {
	tty := false
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			tty = true
		}
	}
	return &demoView{w: w, qs: qs, produced: produced, tty: tty, start: time.Now(), lastRetry: make([]int64, len(qs))}
}

// refresh prints one frame and reports whether every job is done.
func (v *demoView) refresh(ctx context.Context) bool {
	var b strings.Builder
	fmt.Fprintf(&b, "%-9s %9s %9s %9s %9s %9s %9s  %s\n", "queue", "produced", "succeeded", "in flight", "delayed", "retries/s", "dead", "dead letters by reason")
	drained := true
	for i, q := range v.qs {
		s, err := q.Stats(ctx)
		if err != nil {
			fmt.Fprintf(&b, "%-9s stats: %v\n", strings.TrimPrefix(q.Name(), "demo-"), err)
			drained = false
			continue
		}
		c := s.Counters
		rate := c["attempts:retry"] - v.lastRetry[i]
		v.lastRetry[i] = c["attempts:retry"]
		fmt.Fprintf(&b, "%-9s %9d %9d %9d %9d %9d %9d  %s\n", strings.TrimPrefix(q.Name(), "demo-"), v.produced[i],
			c["attempts:success"], s.Jobs, s.Delayed, rate, s.DLQ, byReason(c))
		if c["attempts:success"]+c["attempts:dead_letter"] < v.produced[i] {
			drained = false
		}
	}
	fmt.Fprintf(&b, "elapsed %s   (Ctrl-C stops)\n", time.Since(v.start).Round(time.Second))
	if v.tty && v.lines > 0 {
		fmt.Fprintf(v.w, "\x1b[%dA\x1b[J", v.lines) // redraw in place
	}
	io.WriteString(v.w, b.String())
	v.lines = strings.Count(b.String(), "\n")
	return drained
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

func (v *demoView) final(ctx context.Context) {
	var produced, ok, dead, retries int64
	for i, q := range v.qs {
		s, err := q.Stats(ctx)
		if err != nil {
			continue
		}
		produced += v.produced[i]
		ok += s.Counters["attempts:success"]
		dead += s.Counters["attempts:dead_letter"]
		retries += s.Counters["attempts:retry"]
	}
	fmt.Fprintf(v.w, "\nsummary: %d produced, %d succeeded, %d dead-lettered, %d still in flight; %d retries in %s\n",
		produced, ok, dead, produced-ok-dead, retries, time.Since(v.start).Round(time.Millisecond))
}
