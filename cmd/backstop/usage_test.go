package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// usageOf runs args and returns what main prints for its usage error.
func usageOf(t *testing.T, args ...string) string {
	t.Helper()
	_, err := runCLI(t, "", args...)
	if !errors.Is(err, errUsage) {
		t.Fatalf("%v: %v, want a usage error", args, err)
	}
	return usageMessage(args, err)
}

// Issue 42: a usage error names the problem and prints the command's own
// usage, not the 40-line global help: an unknown command with the command
// it is likely a typo of, a missing required flag or argument, a typo'd
// flag, a duration without its unit.
func TestUsageErrorsNameTheProblem(t *testing.T) {
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"frobnicate"}, []string{`backstop: unknown command "frobnicate"` + "\n", `Run "backstop help" for the commands.`}},
		{[]string{"demoo"}, []string{`unknown command "demoo" (did you mean "demo"?)`}},
		{[]string{"policy", "chek"}, []string{`unknown command "policy chek" (did you mean "policy check"?)`, "usage: backstop policy check ", "       backstop policy show PRESET\n"}},
		{[]string{"policy"}, []string{"backstop: policy needs a command", "usage: backstop policy check "}},
		{[]string{"queue", "stats"}, []string{"backstop: --queue is required\n", "usage: backstop queue stats --queue Q [flags]\n", "\nflags:\n", "-redis.url", `Run "backstop queue stats -h"`}},
		{[]string{"policy", "plot", "critical"}, []string{"backstop: --out is required", "usage: backstop policy plot FILE|PRESET --out"}},
		{[]string{"policy", "check"}, []string{"backstop: missing FILE|PRESET\n"}},
		{[]string{"policy", "show"}, []string{"backstop: missing PRESET\n", "usage: backstop policy show PRESET\n"}},
		{[]string{"policy", "check", "critical", "batch"}, []string{`backstop: unexpected argument "batch"`}},
		{[]string{"demo", "--duraton", "5s"}, []string{"backstop: unknown flag --duraton (did you mean --duration?)\n", "usage: backstop demo [flags]\n", "-workers int"}},
		{[]string{"demo", "--duration", "5"}, []string{"backstop: --duration 5: missing unit, e.g. 5s\n"}},
		{[]string{"simulate", "--recovery", "soon"}, []string{"backstop: --recovery soon: not a duration, e.g. 500ms, 5s, 2m or 1h30m\n"}},
		{[]string{"decide", "--policy"}, []string{"backstop: --policy needs a value\n"}},
		{[]string{"simulate", "--clients", "many"}, []string{"backstop: --clients many: parse error"}},
	} {
		msg := usageOf(t, c.args...)
		for _, w := range c.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%v: no %q in\n%s", c.args, w, msg)
			}
		}
		if strings.Contains(msg, "commands:") {
			t.Errorf("%v: the whole usage is printed:\n%s", c.args, msg)
		}
	}
	// A bare "backstop" gets the whole usage.
	if msg := usageOf(t); !strings.HasPrefix(msg, usage) {
		t.Errorf("backstop: %q, want the usage", msg)
	}
}

func TestClosest(t *testing.T) {
	for _, c := range []struct{ word, want string }{
		{"chek", "check"}, {"chekc", "check"}, {"duraton", "duration"}, {"frobnicate", ""}, {"x", ""}, {"polcy", "policy"},
	} {
		if got := closest(c.word, []string{"check", "duration", "plot", "policy", "presets"}); got != c.want {
			t.Errorf("closest(%q) = %q, want %q", c.word, got, c.want)
		}
	}
}

// Issue 42: rules generate and dashboards generate make the output
// directory; before, they failed when it did not exist.
func TestGenerateMakesTheOutputDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	for _, args := range [][]string{{"rules", "generate", "--out", dir}, {"dashboards", "generate", "--out", dir}} {
		if _, err := runCLI(t, "", args...); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
	}
	for _, name := range []string{"backstop.alerts.yml", "backstop-queue.json"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Error(err)
		}
	}
}

// Issue 42: decide keeps the compiled module in the user's cache
// directory, so the next run loads it instead of compiling it (about a
// second each run before).
func TestDecideKeepsTheCompiledModule(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache)
	t.Setenv("HOME", cache)
	if _, err := runCLI(t, `{"attempt":1,"http_status":503}`, "decide", "--policy", "critical"); err != nil {
		t.Fatal(err)
	}
	var files int
	filepath.WalkDir(filepath.Join(cache, "backstop", "wazero"), func(_ string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files++
		}
		return nil
	})
	if files == 0 {
		t.Error("decide left nothing in its compilation cache")
	}
	// An unusable cache directory does not stop it.
	t.Setenv("XDG_CACHE_HOME", "/dev/null/nowhere")
	t.Setenv("HOME", "/dev/null/nowhere")
	if out, err := runCLI(t, `{"attempt":1,"http_status":503}`, "decide", "--policy", "critical"); err != nil || !strings.Contains(out, `"action":"retry"`) {
		t.Errorf("without a cache: %v %s", err, out)
	}
}

// Issue 42: queue stats prints its counters in words, not raw hash fields.
func TestStatsRowsInWords(t *testing.T) {
	rows := statsRows(map[string]int64{
		"enqueued": 10, "attempts:success": 6, "attempts:retry": 3, "attempts:dead_letter": 2, "attempts:deferred": 1,
		"retries:transient": 3, "deferred:circuit_open": 1, "dead_letters:max_attempts_reached": 2, "max_attempts_reached": 2,
		"finished:success:1": 5, "finished:success:2": 1, "finished_sum:success": 7, "finished:dead_letter:3": 2, "finished_sum:dead_letter": 6,
		"promoted": 3, "t:a:attempts:success": 6, "types": 1, "types:known:a": 1, "something_new": 4,
	})
	var b strings.Builder
	for _, r := range rows {
		b.WriteString(r[0] + ": " + r[1] + "\n")
	}
	want := `enqueued: 10
attempts: success 6, retry 3, deferred 1, dead letter 2
retries by reason: transient 3
deferrals by reason: circuit_open 1
dead letters by reason: max_attempts_reached 2
jobs that succeeded: 6, on attempt 1.17 on average
jobs dead-lettered: 2, on attempt 3.00 on average
moves: promoted when due 3
something_new: 4
`
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}

// Issue 42: the CLI's URL flags are dotted as the exporter's are
// (--redis.url, BACKSTOP_REDIS_URL in both); the old names still work,
// with one deprecation line, and the help lists the new names only.
func TestRenamedFlags(t *testing.T) {
	_, stderr, err := runCLIStderr(t, "queue", "stats", "--queue", "x", "--redis-url", "redis://127.0.0.1:1/0")
	if err == nil || strings.Count(stderr, "deprecated") != 1 || !strings.Contains(stderr, "backstop: --redis-url is deprecated: use --redis.url\n") {
		t.Errorf("old name: %v\n%s", err, stderr)
	}
	_, stderr, _ = runCLIStderr(t, "queue", "stats", "--queue", "x", "--redis.url", "redis://127.0.0.1:1/0")
	if strings.Contains(stderr, "deprecated") {
		t.Errorf("new name: %s", stderr)
	}
	// The old name counts as the new one: two brokers are still refused.
	if _, err := runCLI(t, "", "queue", "stats", "--queue", "x", "--redis-url", "redis://h/0", "--amqp.url", "amqp://h"); !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "not both") {
		t.Errorf("--redis-url with --amqp.url: %v", err)
	}
	out, _ := runCLI(t, "", "queue", "stats", "-h")
	if strings.Contains(out, "redis-url") || !strings.Contains(out, "-redis.url") {
		t.Errorf("help:\n%s", out)
	}
}
