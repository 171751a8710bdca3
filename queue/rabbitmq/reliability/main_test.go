package reliability

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/backstop-dev/backstop"
	"github.com/backstop-dev/backstop/internal/testing/javatest"
	"github.com/backstop-dev/backstop/internal/testing/rabbittest"
	"github.com/backstop-dev/backstop/policy"
	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/rabbitmq"
)

// The tests re-execute this test binary as worker processes
// (BACKSTOP_RELIABILITY_ROLE), so that they can SIGKILL them.
func TestMain(m *testing.M) {
	if role := os.Getenv("BACKSTOP_RELIABILITY_ROLE"); role != "" {
		if err := workerRole(role); err != nil {
			fmt.Fprintln(os.Stderr, "reliability worker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(shared.Run(m))
}

// shared is one broker for the tests that neither restart nor kill it.
var shared rabbittest.Shared

// workerPolicy retries after a constant second: every retry hops level 0.
const workerPolicy = `{"max_attempts": 3, "backoff": {"strategy": "constant", "base": "1s"}, "jitter": {"mode": "none"}}`

// expected is a crash-test job's fate, a pure function of its id, so that
// a re-executed attempt fails or succeeds the same way: 10% fail for good
// (400, dead letter permanent_error at attempt 1), 5% keep failing (503,
// max_attempts_reached at attempt 3), 25% fail once (503) and succeed at
// attempt 2, the rest succeed at once.
func expected(id string) (finalAttempt int64, deadReason string) {
	sum := sha256.Sum256([]byte("fate/" + id))
	switch v := binary.BigEndian.Uint32(sum[:4]) % 100; {
	case v < 10:
		return 1, "permanent_error"
	case v < 15:
		return 3, "max_attempts_reached"
	case v < 40:
		return 2, ""
	}
	return 1, ""
}

// outcome is the handler's answer for attempt n of job id.
func outcome(id string, n int64) error {
	final, dead := expected(id)
	switch {
	case dead == "permanent_error":
		return &backstop.Failure{HTTPStatus: 400, Err: errors.New("400 bad request")}
	case n < final || dead != "":
		return &backstop.Failure{HTTPStatus: 503, Err: errors.New("503 unavailable")}
	}
	return nil
}

// ledgerLine is one execution: job id (6 bytes), attempt, S(ucceeded) or
// F(ailed): fixed width, so the ledger's size counts executions, and under
// PIPE_BUF, so O_APPEND writes from many processes never interleave.
func ledgerLine(id string, attempt int64, ok bool) []byte {
	r := byte('F')
	if ok {
		r = 'S'
	}
	return fmt.Appendf(nil, "%-6s %d %c\n", id, attempt%10, r)
}

const ledgerLineLen = 11

// quietLog logs errors only: reconnections after the broker restarts the
// tests make are their plan, not news.
var quietLog = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))

// workerRole runs one worker process until SIGTERM (or its SIGKILL):
// role crash runs the crash test's jobs, role poison kills itself on the
// job "poison".
func workerRole(role string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	env := func(k string) string { return os.Getenv("BACKSTOP_RELIABILITY_" + k) }
	atoi := func(k string) int { n, _ := strconv.Atoi(env(k)); return n }
	ledger, err := os.OpenFile(env("LEDGER"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer ledger.Close()
	p, err := policy.Parse([]byte(workerPolicy))
	if err != nil {
		return err
	}
	// URL lists the nodes; worker i starts at node i, failing over to the
	// others in turn.
	urls := strings.Fields(env("URL"))
	first := atoi("INDEX") % len(urls)
	urls = append(urls[first:], urls[:first]...)
	b, err := rabbitmq.Open(ctx, urls[0], rabbitmq.WithLogger(quietLog), rabbitmq.WithFailover(urls[1:]...))
	if err != nil {
		return err
	}
	defer b.Close()
	q := b.Queue(env("QUEUE"), rabbitmq.WithMaxDeliveries(atoi("MAX_DELIVERIES")))
	handler := func(ctx context.Context, j queue.Job) error {
		if role == "poison" && j.ID == "poison" {
			ledger.Write(ledgerLine(j.ID, j.Attempt, false))
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		}
		err := outcome(j.ID, j.Attempt)
		if role == "poison" {
			err = nil
		}
		// Recorded before the outcome is applied: a kill in between is
		// exactly what makes a duplicate execution.
		if _, werr := ledger.Write(ledgerLine(j.ID, j.Attempt, err == nil)); werr != nil {
			return werr
		}
		return err
	}
	return q.Work(ctx, backstop.Native(p), handler, rabbitmq.WithPrefetch(atoi("PREFETCH")),
		rabbitmq.WithConcurrency(atoi("CONCURRENCY")))
}

// fleet runs worker processes of one role and restarts the ones that die.
type fleet struct {
	t      *testing.T
	role   string
	env    []string
	java   int // the last java workers are Java processes (sdk/java RabbitCrashWorker)
	procs  []*exec.Cmd
	exited []chan struct{}
	starts int
}

func newFleet(t *testing.T, role string, n int, env ...string) *fleet {
	return newMixedFleet(t, role, n, 0, env...)
}

// newMixedFleet is newFleet whose last java workers run in Java (role
// crash only).
func newMixedFleet(t *testing.T, role string, n, java int, env ...string) *fleet {
	f := &fleet{t: t, role: role, env: env, java: java, procs: make([]*exec.Cmd, n), exited: make([]chan struct{}, n)}
	for i := range n {
		f.start(i)
	}
	t.Cleanup(func() {
		for i, c := range f.procs {
			c.Process.Kill()
			<-f.exited[i]
		}
	})
	return f
}

func (f *fleet) start(i int) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	if i >= len(f.procs)-f.java {
		cmd = javatest.Command(f.t, "RabbitCrashWorker")
	}
	cmd.Env = append(append(os.Environ(), "BACKSTOP_RELIABILITY_ROLE="+f.role, "BACKSTOP_RELIABILITY_INDEX="+strconv.Itoa(i)), f.env...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		f.t.Fatal(err)
	}
	f.starts++
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	f.procs[i], f.exited[i] = cmd, done
}

// kill SIGKILLs worker i and starts another in its place.
func (f *fleet) kill(i int) {
	f.procs[i].Process.Signal(syscall.SIGKILL)
	<-f.exited[i]
	f.start(i)
}

// revive starts again the workers that died by themselves; it returns how
// many.
func (f *fleet) revive() int {
	n := 0
	for i := range f.procs {
		select {
		case <-f.exited[i]:
			f.start(i)
			n++
		default:
		}
	}
	return n
}

// stop ends every worker gracefully (SIGTERM: in-flight jobs finish).
func (f *fleet) stop() {
	for i, c := range f.procs {
		c.Process.Signal(syscall.SIGTERM)
		<-f.exited[i]
	}
}
