package main

import (
	"errors"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Issue 12: demo --broker rabbitmq starts its own rabbitmq-server, runs the
// three queues with the Go RabbitMQ workers, and shows the priority
// separation: demo-payments (latency-critical) never waits behind
// demo-emails' marketing backlog. The broker is gone when the demo ends.
func TestDemoOnRabbitMQ(t *testing.T) {
	defer func(tr, every, dur time.Duration, backlog int) {
		demoTrickle, demoOutageEvery, demoOutageFor, demoBacklog = tr, every, dur, backlog
	}(demoTrickle, demoOutageEvery, demoOutageFor, demoBacklog)
	demoTrickle, demoOutageEvery, demoOutageFor, demoBacklog = 50*time.Millisecond, 3*time.Second, time.Second, 1500
	out, err := runCLI(t, "", "demo", "--broker", "rabbitmq", "--duration", "5s", "--listen", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out)
	}
	for _, want := range []string{"demo-payments   payments", "demo-emails     emails", "demo-reports    reports",
		"rabbitmq-server started for the demo", "dlq inspect --amqp.url amqp://guest:guest@127.0.0.1:", "a marketing backlog of 1500 jobs on demo-emails"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
	m := regexp.MustCompile(`summary: (\d+) produced, (\d+) succeeded, (\d+) dead-lettered, (\d+) retries`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no summary:\n%s", out)
	}
	for i, what := range []string{"", "produced", "succeeded", "dead-lettered", "retries"} {
		if n, _ := strconv.Atoi(m[i]); i > 0 && n == 0 {
			t.Errorf("summary %q: no job %s", m[0], what)
		}
	}
	w := regexp.MustCompile(`longest wait of a first attempt: demo-payments (\S+), demo-emails (\S+), demo-reports (\S+)`).FindStringSubmatch(out)
	if w == nil {
		t.Fatalf("no waits:\n%s", out)
	}
	payments, err1 := time.ParseDuration(w[1])
	emails, err2 := time.ParseDuration(w[2])
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	// The two queues share the broker and the machine, not a queue: the
	// backlog's wait is emails' alone.
	if payments >= emails {
		t.Errorf("demo-payments waited %s, demo-emails (behind its backlog) %s: want payments' shorter\n%s", payments, emails, out)
	}
	port := regexp.MustCompile(`RabbitMQ: amqp://guest:guest@127\.0\.0\.1:(\d+)/`).FindStringSubmatch(out)
	if port == nil {
		t.Fatalf("no broker URL in\n%s", out)
	}
	if ps, _ := exec.Command("pgrep", "-f", "backstop"+port[1]+"@localhost").Output(); len(ps) != 0 {
		t.Errorf("the demo's broker still runs after the demo: %s", ps)
	}
}

// Without rabbitmq-server the demo says which package to install.
func TestDemoOnRabbitMQWithoutTheServer(t *testing.T) {
	defer func(p []string) { rabbitServerPaths = p }(rabbitServerPaths)
	rabbitServerPaths = []string{"/nonexistent/rabbitmq-server"}
	t.Setenv("PATH", t.TempDir())
	_, err := runCLI(t, "", "demo", "--broker", "rabbitmq", "--listen", "127.0.0.1:0")
	if err == nil || !strings.Contains(err.Error(), "rabbitmq-server not found") || !strings.Contains(err.Error(), "apt-get install rabbitmq-server") {
		t.Errorf("demo without rabbitmq-server: %v", err)
	}
	for args, want := range map[string]string{
		"--broker kafka": `--broker: must be redis or rabbitmq (got "kafka")`,
		"--broker rabbitmq --redis.url redis://x": "--redis.url goes with --broker redis",
	} {
		if _, err := runCLI(t, "", append([]string{"demo"}, strings.Fields(args)...)...); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("demo %s: %v, want %q", args, err, want)
		}
	}
}
