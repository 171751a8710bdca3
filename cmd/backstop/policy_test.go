package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func writePolicyFile(t *testing.T, name, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// Totals past time.Duration's 292 years print in hours; they wrapped
// negative ("-1h34m33.709551616s").
func TestPolicyCheckTotalsDoNotWrapNegative(t *testing.T) {
	path := writePolicyFile(t, "huge.yaml", "max_attempts: 5\nbackoff: {base: 2562047h, cap: 2562047h}\njitter: {mode: none}\n")
	out, err := runCLI(t, "", "policy", "check", "--chart", path)
	if err != nil {
		t.Fatal(err)
	}
	if regexp.MustCompile(`\s-\d`).MatchString(out) {
		t.Errorf("a negative duration:\n%s", out)
	}
	for _, want := range []string{"2562047h0m0s", "5124094h0m0s", "10248188h0m0s", "attempt 5 is the last"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// --rows is bounded: 50,000,000 rows took 3.5 GB. A policy with unlimited
// attempts and full jitter has a schedule without end, so the bound is all
// that stops it.
func TestPolicyCheckBoundsRows(t *testing.T) {
	unlimited := writePolicyFile(t, "unlimited.yaml", "max_attempts: 0\nmax_elapsed: 1h\nbackoff: {base: 1ms, cap: 2ms}\n")
	for _, rows := range []string{"10001", "50000000", "0", "-1"} {
		_, err := runCLI(t, "", "policy", "check", "--rows", rows, unlimited)
		if err == nil || err.Error() != "--rows: must be in 1..10000 (got "+rows+")" {
			t.Fatalf("--rows %s: %v", rows, err) // not on to 50,000,000 rows
		}
	}
	out, err := runCLI(t, "", "policy", "check", "--rows", "10000", unlimited)
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`\n +10000 `).MatchString(out) || !strings.HasSuffix(out, "(first 10000 rows, the most --rows shows)\n") {
		t.Errorf("10000 rows: %s", out[max(0, len(out)-300):])
	}
}

// policy plot's --attempts, --draws and --compare are bounded, with a
// message naming the flag.
func TestPolicyPlotBoundsAttemptsAndDraws(t *testing.T) {
	out := filepath.Join(t.TempDir(), "x.svg")
	for _, c := range []struct{ flag, value, want string }{
		{"--attempts", "1001", "--attempts: must be in 0..1000 (got 1001)"},
		{"--attempts", "-1", "--attempts: must be in 0..1000 (got -1)"},
		{"--draws", "10001", "--draws: must be in 1..10000 (got 10001)"},
		{"--draws", "0", "--draws: must be in 1..10000 (got 0)"},
	} {
		_, err := runCLI(t, "", "policy", "plot", "default", "--out", out, c.flag, c.value)
		if err == nil || err.Error() != c.want {
			t.Errorf("%s %s: %v, want %s", c.flag, c.value, err, c.want)
		}
	}
	_, err := runCLI(t, "", "policy", "plot", "default", "--out", out, "--compare", strings.Repeat("default,", 20))
	if want := "--compare: at most 19 policies on a chart (got 20)"; err == nil || err.Error() != want {
		t.Errorf("--compare of 20: %v, want %s", err, want)
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("a refused plot wrote its file")
	}
	if _, err := runCLI(t, "", "policy", "plot", "default", "--out", out, "--attempts", "1000", "--draws", "10", "--compare", strings.Repeat("critical,", 19)); err != nil {
		t.Errorf("at the bounds: %v", err)
	}
}

// A policy argument is read up to one byte past the size limit, enough for
// the loader to refuse it, however large the file (or endless the device).
func TestReadPolicyReadsAtMostOnePastTheLimit(t *testing.T) {
	big := writePolicyFile(t, "big.yaml", "max_attempts: 3\n#"+strings.Repeat("x", 4<<20))
	src, _, err := readPolicy(big)
	if err != nil || len(src) != 64<<10+1 {
		t.Fatalf("read %d bytes, %v; want %d", len(src), err, 64<<10+1)
	}
	_, err = runCLI(t, "", "policy", "check", big)
	if err == nil || !strings.Contains(err.Error(), "big.yaml: (document): must be at most 65536 bytes (64 KiB)") {
		t.Errorf("policy check of a 4 MiB file: %v", err)
	}
}

// Thousands of problems print as twenty lines and a count.
func TestPolicyCheckPrintsTwentyProblemsAndACount(t *testing.T) {
	var b strings.Builder
	for i := range 5000 {
		fmt.Fprintf(&b, "k%d: 0\n", i)
	}
	path := writePolicyFile(t, "typos.yaml", b.String())
	_, err := runCLI(t, "", "policy", "check", path)
	if err == nil {
		t.Fatal("no error")
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != 22 || !strings.HasSuffix(lines[20], "typos.yaml:20: k19: unknown field") ||
		!strings.HasSuffix(lines[21], "typos.yaml: and 4980 more") {
		t.Errorf("%d lines, ending %q", len(lines), lines[max(0, len(lines)-2):])
	}
}

// A second YAML document is an error naming its line, and so is an anchor:
// the CLI reads policy files as every wasm host does (one YAML subset).
func TestPolicyCheckYAMLDocumentsAndAliases(t *testing.T) {
	_, err := runCLI(t, "", "policy", "check", writePolicyFile(t, "two.yaml", "max_attempts: 3\n---\nmax_attempts: 4\n"))
	if err == nil || !strings.Contains(err.Error(), "two.yaml:2: (document): must be one YAML document (a second one starts at line 2)") {
		t.Errorf("two documents: %v", err)
	}
	_, err = runCLI(t, "", "policy", "check", writePolicyFile(t, "alias.yaml", "max_attempts: &n 4\nuncertain: {max_attempts: *n}\n"))
	if err == nil || !strings.Contains(err.Error(), `alias.yaml:1: max_attempts: line 1: anchors and aliases are not supported (found the anchor "&n")`) {
		t.Errorf("alias: %v", err)
	}
}

// Issue 43: policy check shows connect_timeout beside attempt_timeout, and
// warns (BP006) when it is not shorter than the attempt it lives in.
func TestPolicyCheckConnectTimeout(t *testing.T) {
	path := writePolicyFile(t, "connect.yaml", "attempt_timeout: 500ms\nconnect_timeout: 100ms\n")
	out, stderr, err := runCLIStderr(t, "policy", "check", "--strict", "--rows", "1", path)
	if err != nil || stderr != "" {
		t.Fatalf("check: %v %q", err, stderr)
	}
	if !strings.Contains(out, "each attempt at most 500ms, each connect at most 100ms;") {
		t.Errorf("stdout:\n%s", out)
	}
	path = writePolicyFile(t, "slow-connect.yaml", "attempt_timeout: 500ms\nconnect_timeout: 2s\n")
	_, stderr, err = runCLIStderr(t, "policy", "check", "--strict", "--rows", "1", path)
	if want := "warning: connect_timeout: BP006: connect_timeout 2s is not shorter than attempt_timeout (500ms)"; !strings.HasPrefix(stderr, want) {
		t.Errorf("stderr %q, want it to start with %q", stderr, want)
	}
	if err == nil || !strings.Contains(err.Error(), "slow-connect.yaml: 1 lint (--strict)") {
		t.Errorf("--strict: %v", err)
	}
}

// Issue 43: policy check warns of each lint on stderr and passes; --strict
// fails on one, for CI.
func TestPolicyCheckWarnsOfLints(t *testing.T) {
	path := writePolicyFile(t, "herd.yaml", "max_attempts: 20\njitter: {mode: none}\n")
	out, stderr, err := runCLIStderr(t, "policy", "check", "--rows", "2", path)
	if err != nil {
		t.Fatalf("a lint failed the check without --strict: %v", err)
	}
	if !strings.Contains(out, "herd.yaml: valid") {
		t.Errorf("stdout:\n%s", out)
	}
	want := "warning: jitter.mode: BP002: jitter none with exponential backoff: clients that failed together retry together; backoff without jitter is the classic herd, use full\n" +
		"warning: max_attempts: BP003: 20 attempts are 19 retries: more than 10 retries needs a reason; state it in lint_ignore.BP003\n"
	if stderr != want {
		t.Errorf("stderr:\n%s\nwant:\n%s", stderr, want)
	}
	_, _, err = runCLIStderr(t, "policy", "check", "--strict", "--rows", "2", path)
	if err == nil || !strings.Contains(err.Error(), "herd.yaml: 2 lints (--strict)") {
		t.Errorf("--strict: %v", err)
	}
	for _, preset := range []string{"default", "batch", "critical", "fast-transient"} {
		if _, stderr, err := runCLIStderr(t, "policy", "check", "--strict", "--rows", "1", preset); err != nil || stderr != "" {
			t.Errorf("--strict %s: %v %q", preset, err, stderr)
		}
	}
}
