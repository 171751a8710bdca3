package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/backstop-dev/backstop/internal/rabbitmqserver"
	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/rabbitmq"
)

// demoRun is what demo's flags ask of a broker's demo.
type demoRun struct {
	jobs     int
	finite   bool
	listen   string
	workers  int
	duration time.Duration // 0: until Ctrl-C (or every job done)
}

// demoBacklog is the marketing campaign the endless RabbitMQ demo drops on
// demo-emails at the start: demo-payments (latency-critical, like one-time
// passwords) has its own queue and workers, so it never waits behind it.
var demoBacklog = 3000

// rabbitServerPaths are where the demo looks for rabbitmq-server: Debian's
// start script first (its /usr/sbin wrapper switches to the rabbitmq user,
// which cannot write the demo's directories), then the PATH.
var rabbitServerPaths = []string{"/usr/lib/rabbitmq/bin/rabbitmq-server"}

func findRabbitServer() (string, error) {
	for _, p := range rabbitServerPaths {
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	if p, err := exec.LookPath("rabbitmq-server"); err == nil {
		return p, nil
	}
	return "", errors.New("--broker rabbitmq: rabbitmq-server not found in /usr/lib/rabbitmq/bin or on the PATH: " +
		"install it (Debian/Ubuntu: sudo apt-get install rabbitmq-server; macOS: brew install rabbitmq); the demo starts its own, " +
		"on loopback ports with a private data directory, and stops it at the end")
}

func demoRabbitMQ(ctx context.Context, stdout io.Writer, o demoRun) error {
	server, err := findRabbitServer()
	if err != nil {
		return err
	}
	if o.finite {
		fmt.Fprintf(stdout, "backstop demo: %d jobs on %d queues\n", o.jobs, len(demoQueues))
	} else {
		fmt.Fprintf(stdout, "backstop demo: a job per queue every %s on %d queues, and a marketing backlog of %d jobs on demo-emails; the payments downstream fails for %s every %s\n",
			demoTrickle, len(demoQueues), demoBacklog, demoOutageFor, demoOutageEvery)
	}
	fmt.Fprintf(stdout, "starting %s (private data directory, loopback ports; a few seconds)\n", server)
	b, err := rabbitmqserver.Start("", rabbitmqserver.WithServer(server))
	if err != nil {
		return fmt.Errorf("--broker rabbitmq: %w", err)
	}
	defer b.Stop()
	fmt.Fprintf(stdout, "RabbitMQ: %s (rabbitmq-server started for the demo; management API %s, guest/guest)\n", b.URL(), b.ManagementURL())
	if o.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.duration)
		defer cancel()
	}

	rt, err := newRuntime(ctx)
	if err != nil {
		return err
	}
	defer rt.Close(context.Background())

	quiet := slog.New(slog.DiscardHandler)
	br, err := rabbitmq.Open(ctx, b.URL(), rabbitmq.WithLogger(quiet),
		rabbitmq.WithWorkOptions(rabbitmq.WithPrefetch(2*o.workers)),
		rabbitmq.WithStatsOptions(rabbitmq.WithManagementAPI(b.ManagementURL(), nil)))
	if err != nil {
		return err
	}
	defer br.Close()
	var qs []queue.Queue
	for _, dq := range demoQueues {
		// Declared before the view reads them; then the broker-neutral
		// interface.
		if err := br.Queue("demo-" + dq.name).Declare(ctx); err != nil {
			return err
		}
		q, err := br.Open("demo-" + dq.name)
		if err != nil {
			return err
		}
		qs = append(qs, q)
	}

	// The broker cannot count outcomes: the workers do, with the metric
	// names the exporter uses for Redis.
	reg := prometheus.NewRegistry()
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("--listen %s: %w (choose another with --listen)", o.listen, err)
	}
	srv := &http.Server{Handler: demoMetricsHandler(reg)}
	go srv.Serve(ln)
	defer srv.Close()
	fmt.Fprintf(stdout, "metrics (the workers'): http://%s/metrics\n", displayAddr(ln.Addr()))
	fmt.Fprint(stdout, demoInspectHelp("--amqp.url", b.URL(), qs[0].Name(), displayAddr(ln.Addr())))

	produced := make([]atomic.Int64, len(qs))
	enqueue := func(k int, id string) error {
		_, err := qs[k].Enqueue(ctx, id, []byte(`{"demo":true}`), queue.EnqueueOptions{})
		if err == nil {
			produced[k].Add(1)
		}
		return err
	}
	if o.finite {
		for i := 0; i < o.jobs; i++ {
			k := i % len(qs)
			if err := enqueue(k, fmt.Sprintf("%s-%05d", demoQueues[k].name, i)); err != nil {
				if ctx.Err() != nil {
					break
				}
				return err
			}
		}
	}

	view := newRabbitView(stdout, qs, produced, reg)
	wctx, stopWorkers := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var down atomic.Bool
	view.down, view.backlog = &down, !o.finite && demoBacklog > 0
	if !o.finite {
		wg.Add(3)
		go func() {
			defer wg.Done()
			for i := 0; i < demoBacklog && wctx.Err() == nil; i++ {
				enqueue(1, fmt.Sprintf("campaign-%05d", i))
			}
		}()
		go func() {
			defer wg.Done()
			t := time.NewTicker(demoTrickle)
			defer t.Stop()
			for i := 0; ; i++ {
				select {
				case <-wctx.Done():
					return
				case <-t.C:
				}
				for k := range qs {
					enqueue(k, fmt.Sprintf("%s-%07d", demoQueues[k].name, i))
				}
			}
		}()
		go func() { defer wg.Done(); demoOutages(wctx, &down) }()
	}
	for k, q := range qs {
		p, err := rt.Load(ctx, []byte(demoQueues[k].policy))
		if err != nil {
			stopWorkers()
			wg.Wait()
			return err
		}
		if k == 0 {
			view.breaker = p
		}
		dq, flaky, wait := demoQueues[k], k == 0, &view.wait[k]
		wg.Add(1)
		go func() {
			defer wg.Done()
			q.Work(wctx, p, func(ctx context.Context, j queue.Job) error {
				if j.Attempt == 1 {
					wait.observe(time.Since(j.FirstEnqueued()))
				}
				time.Sleep(time.Duration(1+len(j.ID)%4) * time.Millisecond) // the call
				return dq.downstream(j.ID, j.Attempt, flaky && down.Load())
			}, queue.WorkOptions{Concurrency: o.workers, Metrics: reg, PolicyName: dq.policyName()})
		}()
	}

	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	winch, stopWinch := resized()
	defer stopWinch()
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-tick.C:
			done = view.refresh(ctx) && o.finite
		case <-winch:
			view.redraw() // the last frame at the new size, at once
		}
	}
	// The workers finish the jobs in hand and apply their outcomes (Work
	// returns after that), so the summary is the queues' true state.
	stopWorkers()
	wg.Wait()
	view.final()
	return nil
}

// maxWait is the longest a first attempt waited in its queue, since the
// view last read it.
type maxWait struct{ ns atomic.Int64 }

func (m *maxWait) observe(d time.Duration) {
	for {
		old := m.ns.Load()
		if int64(d) <= old || m.ns.CompareAndSwap(old, int64(d)) {
			return
		}
	}
}

func (m *maxWait) take() time.Duration { return time.Duration(m.ns.Swap(0)) }

// rabbitView is the live view of the RabbitMQ demo: the Redis view's
// columns, from the broker (ready, delayed, dead letters) and the workers'
// metrics (outcomes), and each queue's wait.
type rabbitView struct {
	*demoView
	rqs       []queue.Queue
	reg       *prometheus.Registry
	wait      []maxWait
	lastWait  []time.Duration
	worstWait []time.Duration
	backlog   bool // demo-emails has a marketing backlog
}

func newRabbitView(w io.Writer, qs []queue.Queue, produced []atomic.Int64, reg *prometheus.Registry) *rabbitView {
	dv := newDemoView(w, nil, produced, nil)
	dv.lastRetry = make([]int64, len(qs))
	return &rabbitView{demoView: dv, rqs: qs, reg: reg,
		wait: make([]maxWait, len(qs)), lastWait: make([]time.Duration, len(qs)), worstWait: make([]time.Duration, len(qs))}
}

// counters reads the workers' metrics as the Redis stats hash's keys
// (attempts:success, dead_letters:permanent_error, ...), per queue.
func (v *rabbitView) counters() map[string]map[string]int64 {
	out := map[string]map[string]int64{}
	fams, _ := v.reg.Gather()
	prefix := map[string]string{"backstop_attempts_total": "attempts:", "backstop_retries_total": "retries:",
		"backstop_deferrals_total": "deferred:", "backstop_dead_letters_total": "dead_letters:"}
	for _, f := range fams {
		p, ok := prefix[f.GetName()]
		if !ok {
			continue
		}
		for _, m := range f.GetMetric() {
			var q, key string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "queue":
					q = l.GetValue()
				case "outcome", "reason":
					key = p + l.GetValue()
				}
			}
			if out[q] == nil {
				out[q] = map[string]int64{}
			}
			out[q][key] += int64(m.GetCounter().GetValue())
		}
	}
	return out
}

// rabbitColumns are the RabbitMQ view's figures: no delayed column, as
// RabbitMQ counts delayed jobs for all queues together (the line below the
// table), and the wait of a first attempt.
var rabbitColumns = []string{"produced", "success", "queued", "retry/s", "dead", "wait"}

func (v *rabbitView) refresh(ctx context.Context) bool {
	cols, _ := v.size()
	t := newDemoTable(cols)
	t.row("queue", "policy", rabbitColumns, "dead letters by reason")
	drained := true
	counts := v.counters()
	var levels int64
	for i, q := range v.rqs {
		produced := v.produced[i].Load()
		c := counts[q.Name()]
		st, err := q.Stats(ctx)
		if err != nil {
			t.line("%-15s stats: %v", q.Name(), err)
			drained = false
			continue
		}
		queued := st.Jobs // ready and unacked
		if r, ok := st.Raw.(rabbitmq.Stats); ok {
			levels = r.DelayLevels // the same for every queue of the vhost
		}
		rate := c["attempts:retry"] - v.lastRetry[i]
		v.lastRetry[i] = c["attempts:retry"]
		// The longest first attempt's wait since the last frame; the last
		// one shown when no job started meanwhile.
		if w := v.wait[i].take(); w > 0 {
			v.lastWait[i] = w
			v.worstWait[i] = max(v.worstWait[i], w)
		}
		t.row(q.Name(), demoQueues[i].policyName(), []string{n(produced), n(c["attempts:success"]), n(queued), n(rate), n(st.DeadLetters),
			v.lastWait[i].Round(time.Millisecond).String()}, byReason(c))
		if c["attempts:success"]+c["attempts:dead_letter"] < produced {
			drained = false
		}
	}
	state := "up"
	if v.down != nil && v.down.Load() {
		state = "DOWN (an outage)"
	}
	if v.breaker != nil {
		if cs, err := v.breaker.CircuitState(ctx, time.Now().UnixMilli()); err == nil {
			state += ", its breaker " + cs.String()
		}
	}
	t.line("payments downstream: %s", state)
	t.line("delayed: %d jobs, in the delay levels all queues share", levels)
	if v.backlog {
		t.line("wait: the longest first attempt's this second; demo-emails' backlog never delays demo-payments")
	} else {
		t.line("wait: the longest a first attempt waited in its queue this second")
	}
	t.line("elapsed %s   (Ctrl-C stops)", time.Since(v.start).Round(time.Second))
	v.draw(t.b.String())
	return drained
}

func (v *rabbitView) final() {
	var produced, ok, dead, retries int64
	counts := v.counters()
	for i, q := range v.rqs {
		c := counts[q.Name()]
		produced += v.produced[i].Load()
		ok += c["attempts:success"]
		dead += c["attempts:dead_letter"]
		retries += c["attempts:retry"]
	}
	fmt.Fprintf(v.w, "\nsummary: %d produced, %d succeeded, %d dead-lettered, %d retries in %s\n",
		produced, ok, dead, retries, time.Since(v.start).Round(100*time.Millisecond))
	if left := produced - ok - dead; left > 0 {
		fmt.Fprintf(v.w, "not finished: %d, in the work queues or the shared delay levels\n", left)
	}
	var waits []string
	for i, q := range v.rqs {
		waits = append(waits, fmt.Sprintf("%s %s", q.Name(), v.worstWait[i].Round(time.Millisecond)))
	}
	fmt.Fprintf(v.w, "longest wait of a first attempt: %s\n", strings.Join(waits, ", "))
}
