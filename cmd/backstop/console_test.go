package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/internal/testing/redistest"
	"github.com/backstop-dev/backstop/internal/testing/webconfig"
	"github.com/backstop-dev/backstop/queue/redisqueue"
)

// backstop console behind --web.config.file: basic auth refuses a request
// without credentials, reads and writes with them, and the audit names the
// signed-in user; no credential of the broker shows.
func TestConsoleCommand(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	q := redisqueue.New(srv.Client(), "payments")
	if err := srv.Client().XAdd(ctx, &redis.XAddArgs{Stream: q.Neutral().Names().DLQ, Values: []any{"id", "order-7", "reason", "permanent_error",
		"error", "card declined", "attempt", "1", "payload", `{"amount":12}`, "dead_lettered_ms", "1700000000000"}}).Err(); err != nil {
		t.Fatal(err)
	}
	webConfig := webconfig.BasicAuth(t, "ops", "s3cret")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- run(runCtx, []string{"console", "--redis.url=redis://" + srv.Addr + "/0", "--queue=payments", "--writable",
			"--web.listen-address=" + addr, "--web.config.file=" + webConfig, "--policy=default"}, nil, io.Discard, io.Discard)
	}()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("console: %v", err)
		}
	})
	do := func(method, path string, form url.Values, user, pass string) (int, string) {
		t.Helper()
		var resp *http.Response
		eventually.True(t, 10*time.Second, method+" "+path+" (the server is starting)", func() bool {
			req, _ := http.NewRequest(method, "http://"+addr+path, strings.NewReader(form.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			if user != "" {
				req.SetBasicAuth(user, pass)
			}
			var err error
			resp, err = http.DefaultClient.Do(req)
			return err == nil
		})
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := do("GET", "/", nil, "", ""); code != http.StatusUnauthorized {
		t.Errorf("overview without credentials: %d, want 401", code)
	}
	if code, _ := do("GET", "/", nil, "ops", "wrong"); code != http.StatusUnauthorized {
		t.Errorf("overview with a wrong password: %d, want 401", code)
	}
	code, body := do("GET", "/", nil, "ops", "s3cret")
	if code != http.StatusOK || !strings.Contains(body, "payments") || !strings.Contains(body, "/policy.svg") {
		t.Fatalf("overview: %d %s", code, body)
	}
	if code, svg := do("GET", "/policy.svg", nil, "ops", "s3cret"); code != http.StatusOK || !strings.Contains(svg, "<svg") {
		t.Errorf("policy.svg: %d", code)
	}
	_, body = do("GET", "/queues/payments/dlq", nil, "ops", "s3cret")
	m := regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`).FindStringSubmatch(body)
	if m == nil || !strings.Contains(body, "order-7") {
		t.Fatalf("list: no token or no order-7: %s", body)
	}
	form := url.Values{"csrf": {m[1]}, "action": {"delete"}, "id": {"order-7"}, "note": {"refunded by hand"}}
	if code, _ := do("POST", "/queues/payments/discard", form, "", ""); code != http.StatusUnauthorized {
		t.Errorf("delete without credentials: %d, want 401", code)
	}
	if code, body := do("POST", "/queues/payments/discard", form, "ops", "s3cret"); code != http.StatusOK {
		t.Fatalf("delete: %d %s", code, body)
	}
	_, body = do("GET", "/queues/payments/audit", nil, "ops", "s3cret")
	for _, want := range []string{"console:ops", "refunded by hand", "order-7"} {
		if !strings.Contains(body, want) {
			t.Errorf("audit lacks %q", want)
		}
	}
}

// Issue 46, safe by default: a writable console needs basic auth
// (--web.config.file) unless only this machine can reach it.
func TestConsoleWritableNeedsAuthOffLoopback(t *testing.T) {
	err := run(context.Background(), []string{"console", "--redis.url=redis://127.0.0.1:1/0", "--queue=payments", "--writable",
		"--web.listen-address=:9798"}, nil, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--writable without --web.config.file lets anyone who reaches :9798") {
		t.Errorf("writable on every interface without auth: %v", err)
	}
	for _, addr := range []string{"127.0.0.1:9798", "[::1]:9798", "localhost:9798"} {
		if !loopback(addr) {
			t.Errorf("loopback(%q) = false", addr)
		}
	}
	for _, addr := range []string{":9798", "0.0.0.0:9798", "10.0.0.1:9798", "[::]:9798"} {
		if loopback(addr) {
			t.Errorf("loopback(%q) = true", addr)
		}
	}
}

// consoleAt runs `backstop console` with args on a loopback port of its
// own until the test ends, and returns its address.
func consoleAt(t *testing.T, args ...string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"console", "--web.listen-address=" + addr}, args...), nil, io.Discard, io.Discard)
	}()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("console: %v", err)
		}
	})
	return addr
}

// overviewUntil reads the overview of the console at addr until it holds
// every one of wants (bounded), and returns the last one read.
func overviewUntil(t *testing.T, addr string, wants ...string) string {
	t.Helper()
	var body string
	err := eventually.Wait(30*time.Second, func() bool {
		resp, err := http.Get("http://" + addr + "/")
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
		for _, w := range wants {
			if !strings.Contains(body, w) {
				return false
			}
		}
		return true
	})
	if err != nil {
		t.Fatalf("overview lacks one of %q: %v\n%s", wants, err, body)
	}
	return body
}

// Without --prometheus.url the console samples the queues itself with the
// exporter's readers, every --sample.interval; a bad interval is a usage
// error.
func TestConsoleSamplesWithoutPrometheus(t *testing.T) {
	srv := redistest.Start(t)
	addr := consoleAt(t, "--redis.url=redis://"+srv.Addr+"/0", "--queue=payments", "--sample.interval=1s")
	body := overviewUntil(t, addr, `<td class="retries">0</td><td class="ingested">0</td>`, "every 1s,", "since ")
	if strings.Contains(body, "Last sample failed") {
		t.Errorf("a sample failed:\n%s", body)
	}
	for _, bad := range []string{"10ms", "31m"} { // 31m: an hour would not always hold two samples
		err := run(context.Background(), []string{"console", "--redis.url=redis://" + srv.Addr + "/0", "--queue=payments", "--sample.interval=" + bad}, nil, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "--sample.interval must be 1s to 30m") {
			t.Errorf("--sample.interval=%s: %v", bad, err)
		}
	}
}

// The console's RabbitMQ sampler is made from --amqp.url (its virtual
// host) and --rabbitmq.management-url: neither URL's password reaches the
// error when one does not parse (an unescaped % in it) or is not the
// management API's.
func TestConsoleRabbitSamplerErrorsHideThePasswords(t *testing.T) {
	for _, c := range []struct{ amqp, mgmt, want, secret string }{
		{"amqp://app:50%off@mq:5672/", "http://guest:guest@mq:15672", "--amqp.url:", "50%off"},
		{"amqp://app:pw@mq:5672/", "http://guest:99%sure@mq:15672", "--rabbitmq.management-url:", "99%sure"},
		{"amqp://app:pw@mq:5672/", "ftp://guest:s3cret-mgmt@mq:15672", "--rabbitmq.management-url:", "s3cret-mgmt"},
	} {
		_, err := rabbitCollector(c.amqp, c.mgmt, []string{"orders"})
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), c.secret) {
			t.Errorf("amqp %s, management %s: %v; want an error of %s without %q", c.amqp, c.mgmt, err, c.want, c.secret)
		}
	}
	c, err := rabbitCollector("amqp://app:pw@mq:5672/", "http://guest:guest@mq:15672", []string{"orders"})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}
