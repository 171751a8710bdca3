package main

import (
	"encoding/csv"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSimulateHerd(t *testing.T) {
	dir := t.TempDir()
	csvPath, svg := filepath.Join(dir, "herd.csv"), filepath.Join(dir, "herd.svg")
	args := []string{"simulate", "--clients", "300", "--capacity", "100", "--recovery", "3s", "--bucket", "250ms", "--seed", "5"}
	out, err := runCLI(t, "", append(args, "--csv", csvPath, "--out", svg)...)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"300 clients in 3 processes", "down for 3s, then serves 100 calls/s; seed 5",
		"calls", "succeeded", "completion p50", "gave up", "budget, breaker  none in this policy", "calls per 250ms"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	again, _ := runCLI(t, "", args...)
	if again != out {
		t.Error("the same seed printed a different run")
	}
	other, _ := runCLI(t, "", append(args[:len(args)-1], "6")...)
	if other == out {
		t.Error("seeds 5 and 6 printed the same run")
	}
	f, err := os.Open(csvPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil || len(rows) < 2 || strings.Join(rows[0], ",") != "start_ms,calls,retries,served,failed" {
		t.Fatalf("csv: %v %v", rows, err)
	}
	checkChartFile(t, svg)
}

func TestSimulateHerdShowsBudgetAndBreaker(t *testing.T) {
	file := filepath.Join(t.TempDir(), "guarded.yaml")
	os.WriteFile(file, []byte("max_attempts: 8\nretry_budget: {max_tokens: 20, token_ratio: 0.5}\ncircuit_breaker: {failure_threshold: 20, open_for: 2s}\n"), 0o644)
	out, err := runCLI(t, "", "simulate", "--policy", file)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"refused by the budget", "by an open breaker; breakers opened 10 times", "circuit_open", "budget_exhausted"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestSimulateContention(t *testing.T) {
	dir := t.TempDir()
	csvPath, png := filepath.Join(dir, "c.csv"), filepath.Join(dir, "c.png")
	out, err := runCLI(t, "", "simulate", "contention", "--clients", "10,20", "--runs", "5", "--csv", csvPath, "--out", png)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"total work", "completion time", "no jitter", "full jitter", "equal jitter", "decorrelated jitter"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	b, err := os.ReadFile(csvPath)
	if err != nil || strings.Count(string(b), "\n") != 1+4*2 {
		t.Errorf("csv (%v):\n%s", err, b)
	}
	checkChartFile(t, png)

	// Policies of one's own, named by their files.
	file := filepath.Join(dir, "slow.yaml")
	os.WriteFile(file, []byte("max_attempts: 0\nmax_elapsed: 1h\nbackoff: {base: 50ms, cap: 2s}\n"), 0o644)
	out, err = runCLI(t, "", "simulate", "contention", "--clients", "10", "--runs", "2", "--policy", "fast-transient,"+file)
	if err != nil || !strings.Contains(out, "fast-transient") || !strings.Contains(out, "slow") {
		t.Errorf("%v:\n%s", err, out)
	}
	if _, err := runCLI(t, "", "simulate", "contention", "--clients", "ten"); err == nil {
		t.Error("--clients ten: no error")
	}
}

// Issue 15 (class of item 11): simulate's flags that size an allocation
// are bounded, with an error naming the flag, before anything runs.
// --clients 2000000000 asked for tens of GB; --bucket 1ms made a row per
// millisecond of the run.
func TestSimulateBoundsItsFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--clients", "1000001"}, "--clients: must be in 1..1000000 (got 1000001)"},
		{[]string{"--clients", "2000000000"}, "--clients: must be in 1..1000000 (got 2000000000)"},
		{[]string{"--clients", "0"}, "--clients: must be in 1..1000000 (got 0)"},
		{[]string{"--clients", "10", "--processes", "11"}, "--processes: must be in 0..10, the clients (got 11)"},
		{[]string{"--capacity", "1000000001"}, "--capacity: must be in 1..1000000000 (got 1000000001)"},
		{[]string{"--capacity", "0"}, "--capacity: must be in 1..1000000000 (got 0)"},
		{[]string{"--recovery", "-1s"}, "--recovery: must be >= 0 (got -1s)"},
		{[]string{"--bucket", "500us"}, "--bucket: must be at least 1ms (got 500µs)"},
		{[]string{"--bucket", "-1ms"}, "--bucket: must be at least 1ms (got -1ms)"},
		// The default run lasts 12.659s: 12660 rows of 1ms.
		{[]string{"--bucket", "1ms"}, "--bucket: 1ms cuts this run of 12.659s into 12660 buckets, more than 10000: use --bucket 2ms or more"},
	} {
		out, err := runCLI(t, "", append([]string{"simulate"}, c.args...)...)
		if err == nil || err.Error() != c.want {
			t.Errorf("%v: %v (%d bytes out), want %s", c.args, err, len(out), c.want)
		}
	}
	// A run of centuries: 1ms buckets were 9.2e12 of them.
	file := filepath.Join(t.TempDir(), "centuries.yaml")
	os.WriteFile(file, []byte("max_attempts: 2\nbackoff: {strategy: constant, base: 2562047h, cap: 2562047h}\njitter: {mode: none}\n"), 0o644)
	_, err := runCLI(t, "", "simulate", "--clients", "1", "--policy", file, "--bucket", "1ms")
	if want := "--bucket: 1ms cuts this run of 2562047h0m0s into 9223369200001 buckets, more than 10000: use --bucket 256h12m16.921s or more"; err == nil || err.Error() != want {
		t.Errorf("1ms over centuries: %v, want %s", err, want)
	}
	out, err := runCLI(t, "", "simulate", "--clients", "1", "--policy", file, "--bucket", "922336921ms")
	if err != nil || strings.Count(out, "\n") > 10_030 {
		t.Errorf("the widest allowed: %v, %d lines", err, strings.Count(out, "\n"))
	}
	if _, err := runCLI(t, "", "simulate", "--bucket", "2ms"); err != nil {
		t.Errorf("--bucket 2ms: %v", err)
	}
}

// simulate contention's --runs, its --clients list and numbers, and its
// --policy list are bounded the same way.
func TestSimulateContentionBoundsItsFlags(t *testing.T) {
	many := func(item string, n int) string { return strings.TrimSuffix(strings.Repeat(item+",", n), ",") }
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--clients", "2", "--runs", "10001"}, "--runs: must be in 1..10000 (got 10001)"},
		{[]string{"--clients", "2", "--runs", "0"}, "--runs: must be in 1..10000 (got 0)"},
		{[]string{"--clients", many("2", 101), "--runs", "1"}, "--clients: at most 100 numbers (got 101)"},
		{[]string{"--clients", "1000001", "--runs", "1"}, "--clients: each must be in 1..1000000 (got 1000001)"},
		{[]string{"--clients", "2", "--runs", "1", "--policy", many("default", 21)}, "--policy: at most 20 policies (got 21)"},
	} {
		_, err := runCLI(t, "", append([]string{"simulate", "contention"}, c.args...)...)
		if err == nil || err.Error() != c.want {
			t.Errorf("%v: %v, want %s", c.args, err, c.want)
		}
	}
	if _, err := runCLI(t, "", "simulate", "contention", "--clients", many("2", 100), "--runs", "1", "--policy", many("default", 20)); err != nil {
		t.Errorf("at the bounds: %v", err)
	}
}

// simulate layers bounds its flags before anything runs.
func TestSimulateLayersFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--layers", "0"}, "--layers: must be in 1..10 (got 0)"},
		{[]string{"--layers", "11"}, "--layers: must be in 1..10 (got 11)"},
		{[]string{"--recovery", "-1s"}, "--recovery: must be >= 0 (got -1s)"},
		{[]string{"--policy", "no-such-preset"}, ""},
	} {
		_, err := runCLI(t, "", append([]string{"simulate", "layers"}, c.args...)...)
		if err == nil || c.want != "" && err.Error() != c.want {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}
