package queue_test

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/host"
	"github.com/backstop-dev/backstop/internal/redistest"
	"github.com/backstop-dev/backstop/queue"
)

// The crash test re-executes this test binary as worker and promoter
// processes (BACKSTOP_CRASH_ROLE), so it can SIGKILL them.
func TestMain(m *testing.M) {
	switch os.Getenv("BACKSTOP_CRASH_ROLE") {
	case "worker", "promoter":
		if err := crashRole(os.Getenv("BACKSTOP_CRASH_ROLE")); err != nil {
			fmt.Fprintln(os.Stderr, "crash role:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

const crashPolicy = `{"max_attempts": 6, "backoff": {"base": "5ms", "cap": "50ms"},
	"retry_after": {"cap": "2s", "on_exceed": "clamp"}}`

// outcome is the simulated downstream: a pure function of job and attempt,
// so a re-executed attempt fails or succeeds the same way. 5% permanent,
// 30% transient, 5% 429 with Retry-After, the rest success.
func outcome(id string, attempt int64) error {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s/%d", id, attempt))
	switch v := binary.BigEndian.Uint32(sum[:4]) % 100; {
	case v < 5:
		return &queue.Failure{HTTPStatus: 400, Err: errors.New("400 bad request")}
	case v < 35:
		return &queue.Failure{HTTPStatus: 503, Err: errors.New("503 unavailable")}
	case v < 40:
		return &queue.Failure{HTTPStatus: 429, RetryAfter: "1", Err: errors.New("429 too many requests")}
	}
	return nil
}

func crashRole(role string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("BACKSTOP_CRASH_REDIS")})
	q := queue.New(rdb, "crash")
	if role == "promoter" {
		for ctx.Err() == nil {
			if _, _, err := q.Promote(ctx, 200); err != nil {
				return err
			}
			time.Sleep(5 * time.Millisecond) // a promoter's tick, not a test waiting
		}
		return nil
	}
	rt, err := host.New(ctx, host.WithCompilationCache(os.Getenv("BACKSTOP_CRASH_CACHE")), host.WithPoolSize(1))
	if err != nil {
		return err
	}
	p, err := rt.Load(ctx, []byte(crashPolicy))
	if err != nil {
		return err
	}
	return q.Work(ctx, p, func(ctx context.Context, j queue.Job) error {
		// Record the execution before its outcome: a crash in between is
		// exactly what makes a duplicate execution.
		rdb.HIncrBy(ctx, "crash:exec", j.ID+"/"+strconv.FormatInt(j.Attempt, 10), 1)
		time.Sleep(time.Millisecond) // the job's work: the window a SIGKILL lands in
		err := outcome(j.ID, j.Attempt)
		if err == nil {
			rdb.SAdd(ctx, "crash:succeeded", j.ID)
		}
		return err
	}, queue.WithConsumer(os.Getenv("BACKSTOP_CRASH_NAME")), queue.WithBatch(8, 50*time.Millisecond),
		queue.WithPromote(20*time.Millisecond, 200), queue.WithReclaim(200*time.Millisecond, time.Second, 50))
}

// TestCrashLosesNothing: 10,000 jobs through worker and promoter processes
// that are SIGKILLed at random at least 20 times. At the end every job is
// in exactly one final place, and the counters equal what happened.
func TestCrashLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test: runs in make test, not with -short")
	}
	const jobs = 10_000
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	q := queue.New(rdb, "crash")
	if err := q.EnsureGroup(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < jobs; i++ {
		if _, err := q.Enqueue(ctx, fmt.Sprintf("job-%05d", i), []byte("p")); err != nil {
			t.Fatal(err)
		}
	}

	cache := t.TempDir()
	procs := map[string]*exec.Cmd{}
	generation := 0
	start := func(name string) {
		role := "worker"
		if strings.HasPrefix(name, "promoter") {
			role = "promoter"
		}
		generation++
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "BACKSTOP_CRASH_ROLE="+role, "BACKSTOP_CRASH_REDIS="+srv.Addr,
			"BACKSTOP_CRASH_CACHE="+cache, fmt.Sprintf("BACKSTOP_CRASH_NAME=%s-%d", name, generation))
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs[name] = cmd
	}
	names := []string{"worker-a", "worker-b", "worker-c", "promoter"}
	for _, n := range names {
		start(n)
	}
	defer func() {
		for _, c := range procs {
			c.Process.Kill()
			c.Wait()
		}
	}()

	rng := rand.New(rand.NewPCG(42, 42))
	kills := 0
	deadline := time.Now().Add(150 * time.Second)
	for {
		// The chaos schedule, not a wait: a kill every 100-400ms.
		time.Sleep(time.Duration(100+rng.IntN(300)) * time.Millisecond)
		if kills < 20 || rng.IntN(2) == 0 {
			victim := names[rng.IntN(len(names))]
			procs[victim].Process.Signal(syscall.SIGKILL)
			procs[victim].Wait()
			kills++
			start(victim)
		}
		succeeded, _ := rdb.SCard(ctx, "crash:succeeded").Result()
		dead, _ := rdb.XLen(ctx, q.Keys().DLQ).Result()
		if kills >= 20 && succeeded+dead >= jobs {
			break
		}
		if time.Now().After(deadline) {
			s, _ := q.Stats(ctx)
			t.Fatalf("not drained after 150s: succeeded %d, dead %d, stats %+v", succeeded, dead, s)
		}
	}
	for _, c := range procs {
		c.Process.Signal(syscall.SIGTERM)
		c.Wait()
	}

	// Every job id in exactly one final place.
	succeeded, _ := rdb.SMembers(ctx, "crash:succeeded").Result()
	place := map[string]string{}
	for _, id := range succeeded {
		place[id] = "succeeded"
	}
	dls, _ := rdb.XRange(ctx, q.Keys().DLQ, "-", "+").Result()
	byReason := map[string]int64{}
	for _, m := range dls {
		id := m.Values["id"].(string)
		if p, dup := place[id]; dup {
			t.Errorf("job %s is both %s and dead-lettered (%v)", id, p, m.Values["reason"])
		}
		place[id] = "dlq"
		byReason[m.Values["reason"].(string)]++
	}
	for i := 0; i < jobs; i++ {
		if _, ok := place[fmt.Sprintf("job-%05d", i)]; !ok {
			t.Errorf("job-%05d was lost", i)
		}
	}
	s, err := q.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s.Jobs != 0 || s.Pending != 0 || s.Delayed != 0 || len(place) != jobs {
		t.Errorf("not drained: %+v, %d placed", s, len(place))
	}
	// The counters equal the outcomes observed.
	c := s.Counters
	if c["enqueued"] != jobs || c["attempts:success"] != int64(len(succeeded)) || c["attempts:dead_letter"] != int64(len(dls)) {
		t.Errorf("counters %v vs %d succeeded, %d dead letters", c, len(succeeded), len(dls))
	}
	for reason, n := range byReason {
		if c["dead_letters:"+reason] != n {
			t.Errorf("dead_letters:%s = %d, the DLQ holds %d", reason, c["dead_letters:"+reason], n)
		}
	}
	execs, _ := rdb.HGetAll(ctx, "crash:exec").Result()
	var total, dups int64
	for _, v := range execs {
		n, _ := strconv.ParseInt(v, 10, 64)
		total += n
		dups += n - 1
	}
	t.Logf("%d jobs: %d succeeded, %d dead-lettered %v; %d kills; %d executions, %d duplicate executions (%.2f%%); %d retries, %d reclaimed",
		jobs, len(succeeded), len(dls), byReason, kills, total, dups, 100*float64(dups)/float64(total), c["attempts:retry"], c["reclaimed"])
}
