package redisqueue_test

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

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/host"
	"github.com/backstop-dev/backstop/idempotency"
	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/internal/testing/javatest"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/redisqueue"
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
		return &backstop.Failure{HTTPStatus: 400, Err: errors.New("400 bad request")}
	case v < 35:
		return &backstop.Failure{HTTPStatus: 503, Err: errors.New("503 unavailable")}
	case v < 40:
		return &backstop.Failure{HTTPStatus: 429, RetryAfter: "1", Err: errors.New("429 too many requests")}
	}
	return nil
}

func crashRole(role string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("BACKSTOP_CRASH_REDIS")})
	q := redisqueue.New(rdb, "crash")
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
	// effect is the job's side effect; first says this was the attempt's
	// first execution.
	effect := func(ctx context.Context, j queue.Job) (first bool, err error) {
		run := j.ID + "/" + strconv.FormatInt(j.Attempt, 10)
		// A run that starts after an earlier run of the same attempt finished
		// is a duplicate the store is there to prevent.
		if done, _ := rdb.HExists(ctx, "crash:finished", run).Result(); done {
			rdb.HIncrBy(ctx, "crash:after_finish", run, 1)
		}
		// Record the execution before its outcome: a crash in between is
		// exactly what makes a duplicate execution.
		n, _ := rdb.HIncrBy(ctx, "crash:exec", run, 1).Result()
		time.Sleep(time.Millisecond) // the job's work: the window a SIGKILL lands in
		err = outcome(j.ID, j.Attempt)
		if err == nil {
			rdb.SAdd(ctx, "crash:succeeded", j.ID)
		}
		return n == 1, err
	}
	// finished marks a run whose work is done (and, with the store,
	// recorded): only the queue's ack is left. For 0.5% of the jobs the
	// worker then kills itself on the first execution: the crash window the
	// random kills rarely hit, and the one the store is for.
	finished := func(ctx context.Context, j queue.Job, first bool) {
		rdb.HSet(ctx, "crash:finished", j.ID+"/"+strconv.FormatInt(j.Attempt, 10), 1)
		if sum := sha256.Sum256([]byte("crash/" + j.ID)); first && binary.BigEndian.Uint32(sum[:4])%1000 < 5 {
			rdb.Incr(ctx, "crash:injected")
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
	}
	handler := func(ctx context.Context, j queue.Job) error {
		first, err := effect(ctx, j)
		if err == nil {
			finished(ctx, j, first)
		}
		return err
	}
	if os.Getenv("BACKSTOP_CRASH_STORE") == "1" {
		// The job id is the key. The lease is shorter than the reclaim's
		// min idle time, so a job reclaimed from a killed worker finds its
		// key completed (replayed) or its lease expired (taken over).
		store := idempotency.New(rdb, idempotency.WithLease(500*time.Millisecond), idempotency.WithMetrics(idempotency.NewMetrics()))
		handler = func(ctx context.Context, j queue.Job) error {
			first := false // stays false when the store replays
			_, err := store.Once(ctx, "crash", j.ID, j.ID, func(ctx context.Context) (_ []byte, err error) {
				first, err = effect(ctx, j)
				return nil, err
			})
			var busy *idempotency.InProgressError
			if errors.As(err, &busy) {
				rdb.Incr(ctx, "crash:in_progress")
				return &backstop.Failure{HTTPStatus: 429, RetryAfter: "1", Err: err}
			}
			if err == nil { // recorded in the store: a redelivery replays it
				finished(ctx, j, first)
			}
			return err
		}
	}
	return q.Work(ctx, p, handler, redisqueue.WithConsumer(os.Getenv("BACKSTOP_CRASH_NAME")), redisqueue.WithBatch(8, 50*time.Millisecond),
		redisqueue.WithPromote(20*time.Millisecond, 200), redisqueue.WithReclaim(200*time.Millisecond, time.Second, 50))
}

// TestCrashLosesNothing: 10,000 jobs through worker and promoter processes
// that are SIGKILLed at random at least 20 times each run, and that kill
// themselves after finishing 0.5% of the jobs, before the ack: half the
// jobs with the side effect as it is, half with it wrapped in the
// idempotency store (Store.Once, the job id as key). At the end every job
// is in exactly one final place, and the counters equal what happened.
//
// With the store, no run is executed again once it finished: a job
// reclaimed after its run was recorded is replayed from the store. What
// the store cannot prevent are runs killed mid-effect, between Begin and
// Complete: their lease expires and the redelivery runs them again. Those
// remain in both halves; the ones after a finished run go.
func TestCrashLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test: runs in make test, not with -short")
	}
	plain := crashRun(t, 5_000, false, goFleet)
	store := crashRun(t, 5_000, true, goFleet)
	t.Logf("duplicate executions: %d without the store, %d with it; of them after a finished run: %d without, %d with",
		plain.dups, store.dups, plain.afterFinish, store.afterFinish)
	if plain.injected == 0 || store.injected == 0 || plain.afterFinish < plain.injected {
		t.Errorf("crashes after a finished run: %d injected without the store (%d runs executed again), %d with it; want some, each executed again without the store",
			plain.injected, plain.afterFinish, store.injected)
	}
	if store.afterFinish != 0 {
		t.Errorf("with the store, %d runs executed again after they finished: %v", store.afterFinish, store.afterFinishRuns)
	}
	// Only mid-effect crashes duplicate with the store; without it, every
	// injected crash adds one to them.
	if store.dups > plain.dups {
		t.Errorf("%d duplicate executions with the store, %d without", store.dups, plain.dups)
	}
}

// TestCrashLosesNothingWithJavaWorkers: the same chaos with two Java worker
// processes (sdk/java, dev.backstop.CrashWorker: a RedisWorker with the same
// policy and handler semantics) beside a Go worker and the promoter,
// SIGKILLed at random like them, with and without the idempotency store
// (the Java IdempotencyStore beside Go's, on the same records). Fewer jobs
// than the Go-only run: it is about the mixed fleet, not the volume. The
// Java build must be there: a missing java or mvn fails the test.
func TestCrashLosesNothingWithJavaWorkers(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test: runs in make test, not with -short")
	}
	fleet := []string{"worker-a", "java-a", "java-b", "promoter"}
	for _, withStore := range []bool{false, true} {
		c := crashRun(t, 1_500, withStore, fleet)
		if c.java == 0 {
			t.Errorf("store %v: the Java worker executed no job", withStore)
		}
		if withStore && c.afterFinish != 0 {
			t.Errorf("with the store, %d runs executed again after they finished: %v", c.afterFinish, c.afterFinishRuns)
		}
	}
}

var goFleet = []string{"worker-a", "worker-b", "worker-c", "promoter"}

// crashCounts are a crash run's duplicate executions: all of them, and those
// that started after an earlier run of the same attempt had finished (only
// the queue's ack was left).
type crashCounts struct {
	dups, afterFinish, injected int64
	afterFinishRuns             map[string]string
	java                        int64 // executions by Java workers
}

func crashRun(t *testing.T, jobs int, withStore bool, names []string) crashCounts {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	q := redisqueue.New(rdb, "crash")
	if err := q.EnsureGroup(ctx); err != nil {
		t.Fatal(err)
	}

	cache := t.TempDir()
	procs := map[string]*exec.Cmd{}
	exited := map[string]chan struct{}{} // closed when procs[name] has exited
	generation := 0
	start := func(name string) {
		role := "worker"
		if strings.HasPrefix(name, "promoter") {
			role = "promoter"
		}
		generation++
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		if strings.HasPrefix(name, "java") {
			cmd = javatest.Command(t, "CrashWorker")
		}
		storeEnv := "BACKSTOP_CRASH_STORE=0"
		if withStore {
			storeEnv = "BACKSTOP_CRASH_STORE=1"
		}
		cmd.Env = append(os.Environ(), "BACKSTOP_CRASH_ROLE="+role, "BACKSTOP_CRASH_REDIS="+srv.Addr, storeEnv,
			"BACKSTOP_CRASH_CACHE="+cache, fmt.Sprintf("BACKSTOP_CRASH_NAME=%s-%d", name, generation))
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs[name] = cmd
		done := make(chan struct{})
		exited[name] = done
		go func() { cmd.Wait(); close(done) }()
	}
	for _, n := range names {
		start(n)
	}
	defer func() {
		for name, c := range procs {
			c.Process.Kill()
			<-exited[name]
		}
	}()

	// A JVM takes seconds to start: the jobs come once the Java workers
	// read, so that they take part from the first job.
	javaWorkers := 0
	for _, n := range names {
		if strings.HasPrefix(n, "java") {
			javaWorkers++
		}
	}
	eventually.True(t, 90*time.Second, "the Java workers started", func() bool {
		n, _ := rdb.Get(ctx, "crash:java_started").Int()
		return n >= javaWorkers
	})
	for i := 0; i < jobs; i++ {
		if _, err := q.Enqueue(ctx, fmt.Sprintf("job-%05d", i), []byte("p")); err != nil {
			t.Fatal(err)
		}
	}

	rng := rand.New(rand.NewPCG(42, 42))
	kills := 0
	deadline := time.Now().Add(150 * time.Second)
	for {
		// The chaos schedule, not a wait: a kill every 100-400ms.
		time.Sleep(time.Duration(100+rng.IntN(300)) * time.Millisecond)
		if kills < 20 || rng.IntN(2) == 0 {
			victim := names[rng.IntN(len(names))]
			procs[victim].Process.Signal(syscall.SIGKILL)
			<-exited[victim]
			kills++
			start(victim)
		}
		for _, name := range names { // a worker that killed itself comes back
			select {
			case <-exited[name]:
				start(name)
			default:
			}
		}
		succeeded, _ := rdb.SCard(ctx, "crash:succeeded").Result()
		dead, _ := rdb.XLen(ctx, q.Keys().DLQ).Result()
		if kills >= 20 && succeeded+dead >= int64(jobs) {
			break
		}
		if time.Now().After(deadline) {
			s, _ := q.Stats(ctx)
			t.Fatalf("not drained after 150s: succeeded %d, dead %d, stats %+v", succeeded, dead, s)
		}
	}
	for name, c := range procs {
		c.Process.Signal(syscall.SIGTERM)
		<-exited[name]
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
	if c["enqueued"] != int64(jobs) || c["attempts:success"] != int64(len(succeeded)) || c["attempts:dead_letter"] != int64(len(dls)) {
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
	after, _ := rdb.HGetAll(ctx, "crash:after_finish").Result()
	var afterFinish int64
	for _, v := range after {
		n, _ := strconv.ParseInt(v, 10, 64)
		afterFinish += n
	}
	busy, _ := rdb.Get(ctx, "crash:in_progress").Int64()
	injected, _ := rdb.Get(ctx, "crash:injected").Int64()
	java, _ := rdb.HGet(ctx, "crash:exec_by", "java").Int64()
	t.Logf("store %v: %d jobs: %d succeeded, %d dead-lettered %v; %d kills and %d crashes after a finished run; %d executions, %d duplicate executions (%.2f%%), %d after a finished run; %d in progress; %d retries, %d reclaimed",
		withStore, jobs, len(succeeded), len(dls), byReason, kills, injected, total, dups, 100*float64(dups)/float64(total), afterFinish, busy, c["attempts:retry"], c["reclaimed"])
	if java > 0 {
		t.Logf("%d executions by Java workers", java)
	}
	return crashCounts{dups: dups, afterFinish: afterFinish, injected: injected, afterFinishRuns: after, java: java}
}
