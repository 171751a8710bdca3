package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/backstop-dev/backstop/policy"
)

func runCLI(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := run(context.Background(), args, strings.NewReader(stdin), &out, &errOut)
	return out.String(), err
}

func TestPolicyCheckPrintsTheSchedule(t *testing.T) {
	out, err := runCLI(t, "", "policy", "check", "critical")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"preset critical: valid", "max attempts 3", "100ms", "200ms", "attempt 3 is the last"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestPolicyCheckNamesEveryProblemWithItsLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(path, []byte("max_attempts: 3\nbackoff:\n  base: 1s\n  cap: 100ms\n  colour: red\n"), 0o644)
	_, err := runCLI(t, "", "policy", "check", path)
	if err == nil {
		t.Fatal("an invalid policy passed the check")
	}
	for _, want := range []string{"bad.yaml:4: backoff.cap: must be >= backoff.base (got 100ms < 1s)", "bad.yaml:5: backoff.colour: unknown field"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if _, err := runCLI(t, "", "policy", "check", "no-such-thing"); err == nil || !strings.Contains(err.Error(), "not a preset") {
		t.Errorf("missing file: %v", err)
	}
}

// decide answers one line per input line, in order, through backstop.wasm;
// a bad line (a blank one too) gets an error and the stream goes on.
func TestDecideJSONLines(t *testing.T) {
	in := strings.Join([]string{
		`{"attempt": 2, "http_status": 429, "retry_after": "7", "random": 0.3}`,
		`not json`,
		`{"attempt": 0, "http_status": 503}`,
		`{"attempt": 1, "http_status": 503, "colour": "red"}`,
		``,
		`{"attempt": 5, "grpc_code": "UNAVAILABLE", "random": 0.3}`,
		`{"attempt": 1, "http_status": 400}`,
	}, "\n")
	out, err := runCLI(t, in, "decide", "--policy", "default")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	want := []string{
		`{"action":"retry","delay_ms":7000,"reason":"retry_after","class":"retryable"}`,
		`{"error":"invalid input line: not valid JSON"}`,
		`{"error":"attempt: must be >= 1 (got 0)"}`,
		`{"error":"colour: unknown field"}`,
		`{"error":"invalid input line: empty"}`,
		`{"action":"dead_letter","delay_ms":0,"reason":"max_attempts_reached","class":"retryable"}`,
		`{"action":"dead_letter","delay_ms":0,"reason":"permanent_error","class":"permanent"}`,
	}
	if len(lines) != len(want) {
		t.Fatalf("%d output lines for 7 input lines:\n%s", len(lines), out)
	}
	for i := range want {
		if lines[i] != want[i] {
			t.Errorf("line %d:\n got %s\nwant %s", i, lines[i], want[i])
		}
		if !json.Valid([]byte(lines[i])) {
			t.Errorf("line %d is not JSON", i)
		}
	}
}

func TestUsage(t *testing.T) {
	if _, err := runCLI(t, "", "frobnicate"); !errors.Is(err, errUsage) {
		t.Errorf("unknown command: %v", err)
	}
	out, _ := runCLI(t, "", "policy", "presets")
	if strings.Count(out, "\n") != len(policy.PresetNames()) {
		t.Errorf("presets:\n%s", out)
	}
}

// The generate commands write what the shipped files hold.
func TestGenerateCommandsWriteTheShippedFiles(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{{"rules", "generate", "--out", dir}, {"dashboards", "generate", "--out", dir}} {
		if _, err := runCLI(t, "", args...); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"rules/backstop.rules.yml", "rules/backstop.alerts.yml", "dashboards/backstop-overview.json", "dashboards/backstop-queue.json"} {
		want, err := os.ReadFile("../../" + name)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(dir, filepath.Base(name)))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: generated file differs from the shipped one (%v)", name, err)
		}
	}
}
