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
