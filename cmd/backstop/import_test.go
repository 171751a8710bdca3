package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/backstop-dev/backstop/policy"
)

func runImport(t *testing.T, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err = run(context.Background(), append([]string{"policy", "import"}, args...), strings.NewReader(stdin), &out, &errOut)
	return out.String(), errOut.String(), err
}

// The queue as `gcloud tasks queues describe` prints it, with the
// reference's example schedule (10s, 300s, 3 doublings).
const gcloudQueue = `name: projects/acme/locations/us-central1/queues/emails
rateLimits:
  maxBurstSize: 100
  maxConcurrentDispatches: 1000
  maxDispatchesPerSecond: 500.0
retryConfig:
  maxAttempts: 10
  maxBackoff: 300s
  maxDoublings: 3
  minBackoff: 10s
state: RUNNING
`

func TestImportCloudTasksKeepsTheSchedule(t *testing.T) {
	out, errOut, err := runImport(t, gcloudQueue, "-")
	if err != nil || errOut != "" {
		t.Fatalf("import: %v, stderr %q", err, errOut)
	}
	want := `{
  "name": "emails",
  "extends": "cloud-tasks",
  "max_attempts": 10,
  "backoff": {
    "strategy": "cloud_tasks",
    "base": "10s",
    "cap": "5m",
    "max_doublings": 3
  },
  "jitter": {
    "mode": "none"
  }
}
`
	if out != want {
		t.Fatalf("got\n%s\nwant\n%s", out, want)
	}
	p, err := policy.Parse([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	// The reference's own figures, then max_attempts: 10 attempts, 9 retries.
	var got []int64
	for a := int64(1); ; a++ {
		d, err := p.Decide(policy.Failure{Attempt: a, HTTPStatus: 503})
		if err != nil {
			t.Fatal(err)
		}
		if d.Action != policy.Retry {
			if a != 10 || d.Reason != policy.MaxAttemptsReached {
				t.Fatalf("attempt %d: %s/%s, want max_attempts_reached at 10", a, d.Action, d.Reason)
			}
			break
		}
		got = append(got, d.DelayMs/1000)
	}
	if s := fmt.Sprint(got); s != "[10 20 40 80 160 240 300 300 300]" {
		t.Errorf("schedule in seconds: got %s, want [10 20 40 80 160 240 300 300 300]", s)
	}
	// Issue 43: and it classifies as Cloud Tasks does (the cloud-tasks
	// preset it extends): every non-2xx retried, 400 and 401 included,
	// whatever the method. Before, the import kept backstop's own table.
	for _, f := range []policy.Failure{{Attempt: 1, HTTPStatus: 400}, {Attempt: 1, HTTPStatus: 401, Method: "POST"}, {Attempt: 1, HTTPStatus: 500, Method: "PATCH"}} {
		if d, err := p.Decide(f); err != nil || d.Action != policy.Retry {
			t.Errorf("%+v: %v %v, want a retry", f, d, err)
		}
	}
	if p.Lints() != nil {
		t.Errorf("lints %v: the preset states why it breaks them", p.Lints())
	}
}

// The REST API's JSON and terraform show -json's snake_case, with -1
// (unlimited attempts) and a duration: Cloud Tasks then retries until the
// duration has passed, checked at each failure (stop_when all).
func TestImportCloudTasksSpellings(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"retryConfig": {"maxAttempts": -1, "minBackoff": "0.100s", "maxBackoff": "3600s", "maxDoublings": 16, "maxRetryDuration": "86400s"}}`,
			`"extends": "cloud-tasks", "max_attempts": 0, "max_elapsed": "24h", "stop_when": "all", "backoff": {"strategy": "cloud_tasks", "base": "100ms", "cap": "1h", "max_doublings": 16}`},
		{`{"values": {"name": "emails", "retry_config": [{"max_attempts": 5, "min_backoff": "1.5s", "max_backoff": "90s", "max_doublings": 0, "max_retry_duration": "0s"}]}}`,
			`"extends": "cloud-tasks", "max_attempts": 5, "backoff": {"strategy": "cloud_tasks", "base": "1.5s", "cap": "90s", "max_doublings": 0}`},
		{"min_backoff: 0.1s\nmax_backoff: 10s\nmax_doublings: 2\nmax_attempts: 3\nmax_retry_duration: 90s\n",
			`"extends": "cloud-tasks", "max_attempts": 3, "max_elapsed": "90s", "stop_when": "all", "backoff": {"strategy": "cloud_tasks", "base": "100ms", "cap": "10s", "max_doublings": 2}`},
	} {
		out, _, err := runImport(t, c.in, "-")
		if err != nil {
			t.Fatalf("%s: %v", c.in, err)
		}
		if got, want := strings.Join(strings.Fields(out), " "), "{ "+strings.Join(strings.Fields(strings.NewReplacer("{", "{ ", "}", " }").Replace(c.want)), " ")+", \"jitter\": { \"mode\": \"none\" } }"; got != want {
			t.Errorf("%s:\ngot  %s\nwant %s", c.in, got, want)
		}
	}
}

func TestImportSpring(t *testing.T) {
	stream := `# Spring Cloud Stream consumer
spring.cloud.stream.bindings.orders-in-0.consumer.max-attempts=5
spring.cloud.stream.bindings.orders-in-0.consumer.back-off-initial-interval=500
spring.cloud.stream.bindings.orders-in-0.consumer.back-off-multiplier=3.0
spring.cloud.stream.bindings.orders-in-0.consumer.back-off-max-interval=20000
`
	out, errOut, err := runImport(t, stream, "-")
	if err != nil || errOut != "" {
		t.Fatalf("import: %v, stderr %q", err, errOut)
	}
	p, err := policy.Parse([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	// Spring's ExponentialBackOffPolicy: 500ms, ×3 each time, at most 20s;
	// 5 attempts are 4 retries.
	var got []int64
	for a := int64(1); a < 5; a++ {
		got = append(got, p.Backoff(a, 0, 0.5))
	}
	if fmt.Sprint(got) != "[500 1500 4500 13500]" || p.MaxAttempts() != 5 {
		t.Errorf("schedule %v, max attempts %d; want [500 1500 4500 13500], 5", got, p.MaxAttempts())
	}

	// Spring Boot's YAML: a Duration with a unit, and defaults said aloud.
	boot := "spring:\n  rabbitmq:\n    listener:\n      simple:\n        retry:\n          enabled: true\n          max-attempts: 4\n          initial-interval: 2s\n          multiplier: 1.5\n"
	out, errOut, err = runImport(t, boot, "-")
	if err != nil {
		t.Fatal(err)
	}
	if want := "backstop: spring.rabbitmq.listener.simple.retry.max-interval not set: Spring Boot's default, 10000ms\n"; errOut != want {
		t.Errorf("stderr %q, want %q", errOut, want)
	}
	p, err = policy.Parse([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	got = got[:0]
	for a := int64(1); a < 6; a++ {
		got = append(got, p.Backoff(a, 0, 0.5))
	}
	if fmt.Sprint(got) != "[2000 3000 4500 6750 10000]" {
		t.Errorf("schedule %v, want [2000 3000 4500 6750 10000]", got)
	}

	// A multiplier of 1 or less is 1 to Spring; an initial interval above
	// max-interval sleeps max-interval.
	out, _, err = runImport(t, "retry.max-attempts=3\nretry.initial-interval=5000\nretry.multiplier=0.5\nretry.max-interval=1000\n", "--from", "spring", "-")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, `"base": "1s"`) || !strings.Contains(out, `"multiplier": 1,`) || !strings.Contains(out, `"cap": "1s"`) {
		t.Errorf("got %s", out)
	}
}

// Issue 43: a RetryConfig that leaves fields out takes Cloud Tasks'
// documented defaults (max_attempts 100, min_backoff 0.1s, max_backoff
// 3600s, max_doublings 16), and the command names each on stderr, spelled
// as the file spells its fields. Before, the import refused it.
func TestImportCloudTasksFillsItsDefaults(t *testing.T) {
	for _, c := range []struct{ in, want, stderr string }{
		{"retryConfig:\n  maxAttempts: 5\n  minBackoff: 1s\n",
			`"extends": "cloud-tasks", "max_attempts": 5, "backoff": {"strategy": "cloud_tasks", "base": "1s", "cap": "1h", "max_doublings": 16}`,
			"backstop: retryConfig.maxBackoff not set: Cloud Tasks' default, 3600s\n" +
				"backstop: retryConfig.maxDoublings not set: Cloud Tasks' default, 16\n"},
		{`{"values": {"retry_config": [{"max_doublings": 3}]}}`,
			`"extends": "cloud-tasks", "max_attempts": 100, "backoff": {"strategy": "cloud_tasks", "base": "100ms", "cap": "1h", "max_doublings": 3}`,
			"backstop: values.retry_config.max_attempts not set: Cloud Tasks' default, 100\n" +
				"backstop: values.retry_config.min_backoff not set: Cloud Tasks' default, 0.100s\n" +
				"backstop: values.retry_config.max_backoff not set: Cloud Tasks' default, 3600s\n"},
	} {
		out, stderr, err := runImport(t, c.in, "--from", "cloud-tasks", "-")
		if err != nil {
			t.Fatalf("%s: %v", c.in, err)
		}
		if got, want := strings.Join(strings.Fields(out), " "), "{ "+strings.Join(strings.Fields(strings.NewReplacer("{", "{ ", "}", " }").Replace(c.want)), " ")+", \"jitter\": { \"mode\": \"none\" } }"; got != want {
			t.Errorf("%s:\ngot  %s\nwant %s", c.in, got, want)
		}
		if stderr != c.stderr {
			t.Errorf("%s: stderr\n%s\nwant\n%s", c.in, stderr, c.stderr)
		}
	}
}

// Every error names the field as the file spells it, and the reason.
func TestImportErrorsNameTheField(t *testing.T) {
	for _, c := range []struct {
		in   string
		args []string
		want []string
	}{
		{`{"retryConfig": {"maxAttempts": 0, "minBackoff": "10", "maxBackoff": "1s", "maxDoublings": -3}}`, nil, []string{
			"retryConfig.maxAttempts: must be -1 (unlimited) or in 1..1000000 (got 0)",
			`retryConfig.minBackoff: must be a duration such as "0.100s" or "3600s" (got 10)`,
			"retryConfig.maxDoublings: must be in 0..1000 (got -3)"}},
		{`{"retryConfig": {"maxAttempts": 3, "minBackoff": "10s", "maxBackoff": "1s"}}`, nil, []string{
			"retryConfig.maxBackoff: must be >= retryConfig.minBackoff (got 1s < 10s)"}},
		{`{"retryConfig": {"minBackoff": "2h"}}`, nil, []string{ // maxBackoff's default, 3600s, is below
			"retryConfig.maxBackoff: must be >= retryConfig.minBackoff (got 3600s < 2h)"}},
		{`{"retryConfig": {"maxAttempts": -1, "minBackoff": "1s", "maxBackoff": "10s", "maxDoublings": 2}}`, nil, []string{
			"retryConfig.maxAttempts: -1 (unlimited) with no maxRetryDuration", "set retryConfig.maxRetryDuration"}},
		{`{"retryConfig": {"maxAttempts": 3, "minBackoff": "0.0001s", "maxBackoff": "-1s", "maxDoublings": 2}}`, nil, []string{
			"retryConfig.minBackoff: must be a whole number of milliseconds (got 0.0001s)",
			"retryConfig.maxBackoff: must not be negative (got -1s)"}},
		{"a.max-attempts=0\na.multiplier=2.5555\na.initial-interval=1.5s\na.max-interval=PT1S\n", nil, []string{
			`a.max-attempts: must be an integer in 1..1000000, counting the first call (got "0")`,
			`a.multiplier: must be a decimal number with at most 3 decimal places, such as 2 or 1.5 (got "2.5555")`,
			`a.initial-interval: must be milliseconds or a duration such as 500ms, 2s or 1m (got "1.5s")`,
			`a.max-interval: must be milliseconds or a duration such as 500ms, 2s or 1m (got "PT1S")`}},
		{"a.multiplier=1001\na.max-attempts=2\n", nil, []string{"a.multiplier: must be at most 1000 (got 1001)"}},
		{"a.multiplier=2\nb.multiplier=3\n", nil, []string{`retry settings under 2 prefixes ("a", "b"): choose one with --prefix`}},
		{"a.multiplier=2\nb.multiplier=3\n", []string{"--prefix", "c"}, []string{`--prefix: no retry settings under "c" (found them under "a", "b")`}},
		{"a: 1\n", nil, []string{"found neither a Cloud Tasks RetryConfig", "name one with --from"}},
		{"not a properties line\n", nil, []string{`line 1: neither a JSON or YAML object nor a properties line (key=value): "not a properties line"`}},
		{"a: 1\n", []string{"--from", "sqs"}, []string{`--from: must be cloud-tasks, spring or auto (got "sqs")`}},
	} {
		_, _, err := runImport(t, c.in, append(c.args, "-")...)
		if err == nil {
			t.Errorf("%q: imported", c.in)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q: error %q lacks %q", c.in, err, w)
			}
		}
	}
}
