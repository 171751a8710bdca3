package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/backstop-dev/backstop/internal/testing/eventually"
	"github.com/backstop-dev/backstop/internal/testing/rabbittest"
)

func TestRabbitMQFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--rabbitmq.url=http://x:15672"}, "no queues: with --rabbitmq.url"},
		{[]string{"--rabbitmq.url=http://x:15672", "--queues.pattern={*}:jobs"}, "use --rabbitmq.queue-pattern"},
		{[]string{"--rabbitmq.url=http://x:15672", "--queues.config=q.yaml"}, "--queues.config describes Redis"},
	} {
		if _, err := parse(tc.args, io.Discard); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parse(%q): %v, want %q", tc.args, err, tc.want)
		}
	}
	// The password never needs a flag: a file, the environment or the URL;
	// the file beats the environment, which beats the URL.
	file := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(file, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(envRabbitUser, "env-user")
	t.Setenv(envRabbitPassword, "from-env")
	for _, tc := range []struct {
		flags          rabbitFlags
		user, password string
	}{
		{rabbitFlags{url: "http://u:p@x"}, "u", "p"},
		{rabbitFlags{url: "http://u:p@x", user: "flag-user"}, "flag-user", "p"},
		{rabbitFlags{url: "http://x", passwordFile: file}, "", "from-file"},
	} {
		os.Unsetenv(envRabbitPassword)
		user, password, ok, err := tc.flags.credentials()
		if err != nil || !ok || user != tc.user || password != tc.password {
			t.Errorf("%+v: %q %q %v %v, want %q %q", tc.flags, user, password, ok, err, tc.user, tc.password)
		}
	}
	t.Setenv(envRabbitPassword, "from-env")
	f, err := parse([]string{"--rabbitmq.url=http://u:p@x", "--queues=a"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if user, password, _, _ := f.rabbit.credentials(); user != "env-user" || password != "from-env" {
		t.Errorf("from the environment: %q %q", user, password)
	}
	if _, _, _, err := (rabbitFlags{passwordFile: "/nonexistent"}).credentials(); err == nil || !strings.Contains(err.Error(), "--rabbitmq.password-file") {
		t.Errorf("missing password file: %v", err)
	}
	if got := f.target(); strings.Contains(got, "u:p") || !strings.Contains(got, "RabbitMQ http://x") {
		t.Errorf("target %q", got)
	}
}

// TestServeRabbitMQ runs the exporter as main does against a real broker,
// with the credentials from the environment, then from a file.
func TestServeRabbitMQ(t *testing.T) {
	b := rabbittest.Start(t)
	ch := b.Channel(t)
	// Enough of the topology for the figures read here: the queue and its DLQ.
	if _, err := ch.QueueDeclare("orders", true, false, false, false, amqp.Table{"x-queue-type": "quorum",
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "orders.dlq"}); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("orders.dlq", true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	if err := ch.PublishWithContext(context.Background(), "", "orders.dlq", false, false, amqp.Publishing{MessageId: "dead-1"}); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(file, []byte("guest\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		env  string
	}{
		{"environment", nil, "guest"},
		{"file", []string{"--rabbitmq.password-file=" + file}, "wrong"}, // the file wins
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(envRabbitUser, "guest")
			t.Setenv(envRabbitPassword, tc.env)
			addr := freeAddr(t)
			ctx, stop := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				done <- run(ctx, append([]string{"--rabbitmq.url=" + b.ManagementURL(), "--rabbitmq.queue-pattern=ord.*",
					"--web.listen-address=" + addr, "--log.level=warn"}, tc.args...), io.Discard)
			}()
			var body string
			eventually.True(t, 30*time.Second, "a scrape with the DLQ's message", func() bool {
				resp, err := http.Get("http://" + addr + "/metrics")
				if err != nil {
					return false
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				body = string(b)
				return strings.Contains(body, `backstop_dlq_size{queue="orders"} 1`+"\n")
			})
			for _, want := range []string{"backstop_up 1\n", "backstop_queues 1\n", `backstop_stream_lag_jobs{group="",queue="orders"} 0` + "\n"} {
				if !strings.Contains(body, want) {
					t.Errorf("no %q in\n%s", want, body)
				}
			}
			resp, err := http.Get("http://" + addr + "/")
			if err != nil {
				t.Fatal(err)
			}
			page, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			for _, want := range []string{"<th>RabbitMQ</th><td>" + b.ManagementURL() + " vhost /</td>", `href="queue?name=orders"`} {
				if !strings.Contains(string(page), want) {
					t.Errorf("landing page lacks %q:\n%s", want, page)
				}
			}
			stop()
			if err := <-done; err != nil {
				t.Errorf("run: %v", err)
			}
		})
	}
}
