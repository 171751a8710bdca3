package console_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/console"
	"github.com/backstop-dev/backstop/exporter"
	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/rabbitmq"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// Bounded work: a page of the list costs the same broker commands whatever
// the DLQ's size (issue 46). The dead letters are written straight into the
// DLQ, as a worker leaves them, so that a large DLQ is quick to make.

// counter counts the Redis commands a client sends.
type counter struct{ n atomic.Int64 }

func (c *counter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { c.n.Add(1); return next(ctx, cmd) }
}
func (c *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { c.n.Add(int64(len(cmds))); return next(ctx, cmds) }
}

// sized is a queue of a DLQ of a given size, and how to count what a page
// of it costs the broker.
type sized struct {
	size int
	q    queue.Queue
	cost func() int64 // the broker commands sent so far (-1: the broker cannot say)
}

func seedRedisDLQ(t testing.TB, rdb *redis.Client, key string, n int) {
	t.Helper()
	ctx := context.Background()
	now := time.Now().UnixMilli()
	for i := 0; i < n; i += 1000 {
		p := rdb.Pipeline()
		for j := i; j < min(n, i+1000); j++ {
			p.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: []any{"id", "job-" + strconv.Itoa(j), "reason", []string{"permanent_error", "max_attempts_reached"}[j%2],
				"error", "upstream answered 400", "attempt", "1", "type", "email", "payload", `{"to":"a@example.com","n":` + strconv.Itoa(j) + `}`,
				"dead_lettered_ms", strconv.FormatInt(now-int64(n-j), 10)}})
		}
		if _, err := p.Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func seedRabbitDLQ(t testing.TB, b *rabbitmq.Broker, url, name string, n int) {
	t.Helper()
	ctx := context.Background()
	if err := b.Queue(name).Declare(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixMilli()
	for i := 0; i < n; i += 500 {
		var dcs []*amqp.DeferredConfirmation
		for j := i; j < min(n, i+500); j++ {
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", rabbitmq.NamesFor(name).DLQ, false, false, amqp.Publishing{
				MessageId: "job-" + strconv.Itoa(j), Body: []byte(`{"to":"a@example.com","n":` + strconv.Itoa(j) + `}`),
				Headers: amqp.Table{rabbitmq.HeaderReason: []string{"permanent_error", "max_attempts_reached"}[j%2],
					rabbitmq.HeaderError: "upstream answered 400", rabbitmq.HeaderAttempt: "1", rabbitmq.HeaderJobType: "email",
					rabbitmq.HeaderDeadLetteredMs: strconv.FormatInt(now-int64(n-j), 10)}})
			if err != nil {
				t.Fatal(err)
			}
			dcs = append(dcs, dc)
		}
		for _, dc := range dcs {
			if ok, err := dc.WaitContext(ctx); !ok || err != nil {
				t.Fatalf("publish to the DLQ: nacked or %v", err)
			}
		}
	}
}

// sizedQueues returns one queue per size on the broker called kind.
func sizedQueues(t testing.TB, kind string, sizes ...int) (string, []sized) {
	t.Helper()
	var out []sized
	switch kind {
	case "redis":
		srv := redistest.Start(t)
		rdb := srv.Client()
		c := &counter{}
		rdb.AddHook(c)
		b := redisqueue.NewBroker(rdb)
		for _, n := range sizes {
			q, _ := b.Open(fmt.Sprintf("dlq-%d", n))
			seedRedisDLQ(t, rdb, q.Names().DLQ, n)
			out = append(out, sized{size: n, q: q, cost: c.n.Load})
		}
	case "rabbitmq":
		url := shared.Broker(t).URL()
		b, err := rabbitmq.Open(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		for _, n := range sizes {
			name := fmt.Sprintf("dlq-%d-%d", n, time.Now().UnixNano()%1e9)
			seedRabbitDLQ(t, b, url, name, n)
			q, _ := b.Open(name)
			out = append(out, sized{size: n, q: q, cost: func() int64 { return -1 }})
		}
	}
	return kind, out
}

var lookedRE = regexp.MustCompile(`looked at (\d+) dead letters`)

// load gets path from s and returns how long it took, what the page says
// it looked at, and the next page's path.
func load(t testing.TB, s *site, path string) (time.Duration, int, string) {
	t.Helper()
	start := time.Now()
	resp, err := http.Get(s.srv.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp)
	took := time.Since(start)
	m := lookedRE.FindStringSubmatch(body)
	if resp.StatusCode != http.StatusOK || m == nil {
		t.Fatalf("GET %s: %d %s", path, resp.StatusCode, body)
	}
	looked, _ := strconv.Atoi(m[1])
	next := ""
	if n := regexp.MustCompile(`id="next" href="([^"]*)"`).FindStringSubmatch(body); n != nil {
		next = strings.ReplaceAll(n[1], "&amp;", "&")
	}
	return took, looked, next
}

// TestPageBounded: the first page, the second, and a filter that matches
// nothing cost the same broker commands (Redis: counted at the client;
// RabbitMQ: the dead letters looked at, each one basic.get, one publish
// and one ack) at 500 and at 3,000 dead letters (both beyond a page's
// scan of 10 × 20).
func TestPageBounded(t *testing.T) {
	for _, kind := range []string{"redis", "rabbitmq"} {
		t.Run(kind, func(t *testing.T) {
			_, qs := sizedQueues(t, kind, 500, 3000)
			var all []queue.Queue
			for _, s := range qs {
				all = append(all, s.q)
			}
			s := serve(t, kind, all, console.WithPageSize(20))
			load(t, s, "/queues/"+qs[0].q.Name()+"/dlq") // the client's connection made
			type cost struct {
				cmds   int64
				looked int
			}
			costs := map[string][]cost{}
			for _, sq := range qs {
				base := "/queues/" + sq.q.Name() + "/dlq"
				for _, step := range []struct{ name, path string }{{"first", base}, {"second", ""}, {"no match", base + "?reason=no_such_reason"}} {
					path := step.path
					if path == "" {
						_, _, path = load(t, s, base)
					}
					before := sq.cost()
					_, looked, _ := load(t, s, path)
					costs[step.name] = append(costs[step.name], cost{sq.cost() - before, looked})
				}
			}
			for name, c := range costs {
				if c[0] != c[1] {
					t.Errorf("%s page: %+v at 500 dead letters, %+v at 3000: want the same", name, c[0], c[1])
				}
				if c[0].looked > 200 {
					t.Errorf("%s page looked at %d dead letters, want at most 10 × 20", name, c[0].looked)
				}
			}
			t.Logf("costs (commands, looked) at 500 and 3000: %+v", costs)
		})
	}
}

// TestPageCostAtScale measures a page at 1,000 and at 100,000 dead letters
// on both brokers, the two sizes alternating (BENCHMARKS.md, "The console's
// DLQ page"). It runs when BACKSTOP_BENCH_CONSOLE=1: making 100,000 dead
// letters takes a while.
func TestPageCostAtScale(t *testing.T) {
	if os.Getenv("BACKSTOP_BENCH_CONSOLE") != "1" {
		t.Skip("set BACKSTOP_BENCH_CONSOLE=1 to measure (BENCHMARKS.md)")
	}
	const loads = 40
	for _, kind := range []string{"redis", "rabbitmq"} {
		_, qs := sizedQueues(t, kind, 1000, 100_000)
		var all []queue.Queue
		for _, s := range qs {
			all = append(all, s.q)
		}
		s := serve(t, kind, all, console.WithPageSize(50))
		load(t, s, "/queues/"+qs[0].q.Name()+"/dlq") // the client's connection made
		times := make([][]time.Duration, len(qs))
		cmds := make([]int64, len(qs))
		looked := make([]int, len(qs))
		heap := make([][2]uint64, len(qs))
		var ms runtime.MemStats
		for i := range loads {
			for j, sq := range qs { // alternating: 1,000 then 100,000, each load
				path := "/queues/" + sq.q.Name() + "/dlq"
				if i%2 == 1 {
					path += "?reason=max_attempts_reached&type=email"
				}
				runtime.GC()
				runtime.ReadMemStats(&ms)
				if i == 0 {
					heap[j][0] = ms.HeapInuse
				}
				before := sq.cost()
				took, n, _ := load(t, s, path)
				times[j] = append(times[j], took)
				cmds[j] += sq.cost() - before
				looked[j] += n
				runtime.GC()
				runtime.ReadMemStats(&ms)
				heap[j][1] = max(heap[j][1], ms.HeapInuse)
			}
		}
		for j, sq := range qs {
			slices.Sort(times[j])
			c := "n/a"
			if sq.cost() >= 0 {
				c = fmt.Sprintf("%.1f", float64(cmds[j])/loads)
			}
			t.Logf("| %s | %d | %s | %.1f | %.2f | %.2f | %.1f → %.1f |", kind, sq.size, c, float64(looked[j])/loads,
				float64(times[j][loads/2].Microseconds())/1000, float64(times[j][loads*9/10].Microseconds())/1000,
				float64(heap[j][0])/(1<<20), float64(heap[j][1])/(1<<20))
		}
	}
}

// The overview's last hour costs a page load nothing at the broker: the
// page reads the history's rings, and only the sampler reads the queues
// (the exporter's readers, here through the client so that its hook
// counts them). A load of the overview with the history sends the same
// commands as one without, and the sampler (every hour: its first sample
// only) sends none while the pages load.
func TestOverviewReadsTheHistoryNotTheBroker(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { rdb.Close() })
	c := &counter{}
	rdb.AddHook(c)
	b := redisqueue.NewBroker(rdb)
	q, err := b.Open("ledger")
	if err != nil {
		t.Fatal(err)
	}
	seedRedisDLQ(t, rdb, redisqueue.KeysFor("ledger").DLQ, 100)
	col, err := exporter.NewCollector(rdb, exporter.WithQueues(exporter.QueueFor("ledger")), exporter.WithClientPipelines())
	if err != nil {
		t.Fatal(err)
	}
	const loads = 20
	perLoad := map[bool]int64{}
	for _, history := range []bool{false, true} {
		var opts []console.Option
		if history {
			opts = append(opts, console.WithExporter(col, 30*time.Minute))
		}
		s := serve(t, b.Kind(), []queue.Queue{q}, opts...)
		eventually.True(t, 10*time.Second, "the first load (the scripts loaded), and the first sample", func() bool {
			_, body := s.get("/")
			return !history || strings.Contains(body, "since ")
		})
		before := c.n.Load()
		for range loads {
			if code, body := s.get("/"); code != http.StatusOK || strings.Contains(body, "Last sample failed") {
				t.Fatalf("overview: %d\n%s", code, body)
			}
		}
		perLoad[history] = (c.n.Load() - before) / loads
		if (c.n.Load()-before)%loads != 0 {
			t.Errorf("history %v: %d commands over %d loads, not the same each", history, c.n.Load()-before, loads)
		}
	}
	t.Logf("Redis commands per overview load: %d without the history, %d with it", perLoad[false], perLoad[true])
	if perLoad[true] != perLoad[false] || perLoad[false] == 0 {
		t.Errorf("commands per overview load: %d with the history, %d without; want the same", perLoad[true], perLoad[false])
	}
}
