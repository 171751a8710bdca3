package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// runCLIStderr is runCLI with what the command wrote on stderr.
func runCLIStderr(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err = run(context.Background(), args, strings.NewReader(""), &out, &errOut)
	return out.String(), errOut.String(), err
}

func buildBackstop(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "backstop")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// Issue 13: with Redis unreachable, a queue command says so in one line
// (address, cause, what to try); before, the client logged a line per
// failed dial, eight over 3s, then the error.
func TestQueueCommandsRedisUnreachable(t *testing.T) {
	bin := buildBackstop(t)
	for _, args := range [][]string{
		{"queue", "stats", "--queue", "q", "--redis.url", "redis://127.0.0.1:1/0"},
		{"dlq", "inspect", "--queue", "q", "--redis.url", "redis://127.0.0.1:1/0"},
		{"dlq", "replay", "--queue", "q", "--limit", "1", "--redis.cluster", "127.0.0.1:1"},
	} {
		var out, errOut bytes.Buffer
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
			t.Errorf("%v: %v, want exit status 1", args, err)
		}
		lines := strings.Split(strings.TrimSuffix(errOut.String(), "\n"), "\n")
		if len(lines) != 1 {
			t.Errorf("%v: %d lines on stderr, want 1:\n%s", args, len(lines), errOut.String())
		}
		for _, want := range []string{"cannot reach Redis at 127.0.0.1:1: connect: connection refused", "--redis."} {
			if !strings.Contains(lines[0], want) {
				t.Errorf("%v: %q lacks %q", args, lines[0], want)
			}
		}
	}
}

// Issue 13: --json keys are snake_case, like every other output.
func TestQueueJSONIsSnakeCase(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	q := redisqueue.New(srv.Client(), "orders")
	q.EnsureGroup(ctx)
	q.Enqueue(ctx, "job-a", []byte("{}"))
	msgs, _ := srv.Client().XReadGroup(ctx, &redis.XReadGroupArgs{Group: "workers", Consumer: "c", Streams: []string{q.Keys().Jobs, ">"}, Count: 1}).Result()
	q.DeadLetter(ctx, msgs[0].Messages[0].ID, "permanent_error", "400")
	url := "--redis.url=redis://" + srv.Addr + "/0"
	for cmd, want := range map[string][]string{
		"queue stats": {"jobs", "pending", "delayed", "dlq", "counters"},
		"dlq inspect": {"size", "scanned", "by_reason", "newest"},
	} {
		out, err := runCLI(t, "", append(strings.Fields(cmd), "--queue", "orders", "--json", url)...)
		if err != nil {
			t.Fatalf("%s: %v", cmd, err)
		}
		var got map[string]json.RawMessage
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("%s: %v\n%s", cmd, err, out)
		}
		for _, k := range want {
			if _, ok := got[k]; !ok {
				t.Errorf("%s --json: no key %q in %s", cmd, k, out)
			}
		}
		if cmd == "dlq inspect" && !strings.Contains(out, `"entry_id":`) || !strings.Contains(out, `"job_id":`) && cmd == "dlq inspect" {
			t.Errorf("dlq inspect --json: newest entries not snake_case: %s", out)
		}
	}
}

// Issue 13: a queue or a reason that does not exist gets a warning on
// stderr, not silent zeros; a real one gets none.
func TestQueueCommandsWarnOnWhatDoesNotExist(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	q := redisqueue.New(srv.Client(), "orders")
	q.EnsureGroup(ctx)
	q.Enqueue(ctx, "job-a", []byte("{}"))
	msgs, _ := srv.Client().XReadGroup(ctx, &redis.XReadGroupArgs{Group: "workers", Consumer: "c", Streams: []string{q.Keys().Jobs, ">"}, Count: 1}).Result()
	q.DeadLetter(ctx, msgs[0].Messages[0].ID, "permanent_error", "400")
	url := "--redis.url=redis://" + srv.Addr + "/0"

	for _, c := range []struct {
		args []string
		want string // "" for no warning
	}{
		{[]string{"queue", "stats", "--queue", "payments", url}, `warning: no queue "payments" in this Redis`},
		{[]string{"dlq", "inspect", "--queue", "payments", url}, `warning: no queue "payments" in this Redis`},
		{[]string{"dlq", "replay", "--queue", "orders", "--limit", "5", "--reason", "max_attemps_reached", url},
			`warning: queue orders has no dead letters with reason "max_attemps_reached" (its reasons: permanent_error)`},
		{[]string{"queue", "stats", "--queue", "orders", url}, ""},
		{[]string{"dlq", "inspect", "--queue", "orders", url}, ""},
		{[]string{"dlq", "replay", "--queue", "orders", "--limit", "5", "--reason", "permanent_error", url}, ""},
	} {
		_, errOut, err := runCLIStderr(t, c.args...)
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if c.want == "" && errOut != "" || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: stderr %q, want %q", c.args, errOut, c.want)
		}
	}
}
