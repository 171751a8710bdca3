// Package crosshost proves that every host decides identically: the same
// 10,000 generated failures go through Go (wazero), Node.js, Python and Java
// (Chicory), and every answer must match, byte for byte.
package crosshost

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/backstop-dev/backstop/host"
	"github.com/backstop-dev/backstop/internal/testing/javatest"
	"github.com/backstop-dev/backstop/internal/vector"
	"github.com/backstop-dev/backstop/policy"
)

const root = "../../.."

// policies: a preset and a file that uses every stateful feature, so the
// budget and breaker sequences must agree too.
var policies = map[string]string{
	"default": "default",
	"stateful": `{"max_attempts": 7, "max_elapsed": "10m", "uncertain": {"max_attempts": 3},
		"backoff": {"strategy": "decorrelated", "base": "100ms", "cap": "30s"}, "jitter": {"mode": "decorrelated"},
		"retry_after": {"mode": "hint", "cap": "2m", "on_exceed": "clamp"},
		"classify": {"http": {"409": "retryable"}, "error_kinds": {"rate_limited": "retryable"}},
		"retry_budget": {"type": "ratio", "ratio": 0.2, "window": "10s", "min_retries_per_second": 2},
		"circuit_breaker": {"failure_threshold": 8, "open_for": "3s", "half_open_successes": 2}}`,
	"linear-proportional": `max_attempts: 12
backoff: {strategy: linear, base: 250ms, cap: 10s}
jitter: {mode: proportional, ratio: 0.3}
`,
	// slowCalls: the slow-call rate (the lines' duration_ms, recorded
	// before each failure is decided) opens this breaker, after some
	// thousand lines; the failure rate alone never does, as only 503s are
	// retryable here, too few in any 4 s to reach minimum_calls.
	// TestAllHostsDecideIdentically checks that the durations open it.
	slowCalls: `max_attempts: 12
classify:
  default: permanent
  http: {"4xx": permanent, "5xx": permanent, "503": retryable}
  grpc: {CANCELLED: permanent, UNKNOWN: permanent, DEADLINE_EXCEEDED: permanent, RESOURCE_EXHAUSTED: permanent,
         ABORTED: permanent, INTERNAL: permanent, UNAVAILABLE: permanent}
  error_kinds: {timeout: permanent, connection_refused: permanent, connection_reset: permanent,
                dns_temporary: permanent, rate_limited: permanent}
circuit_breaker:
  type: failure_rate
  failure_rate_threshold: 100
  slow_call_rate_threshold: 55
  slow_call_duration_threshold: 2s
  sliding_window: {type: time, size: 4s}
  minimum_calls: 14
  open_for: 3s
`,
}

const slowCalls = "slow-calls"

// line is one input line: a failure and, on most lines, the call's
// duration_ms (testdata/vectors/README.md, "Input lines"), a few of them
// bad values every command must refuse alike.
type line struct {
	vector.Input
	Duration any // nil: none
}

func (l line) marshal() ([]byte, error) {
	b, err := json.Marshal(l.Input)
	if err != nil || l.Duration == nil {
		return b, err
	}
	d, err := json.Marshal(l.Duration)
	return append(append(b[:len(b)-1], `,"duration_ms":`...), append(d, '}')...), err
}

// withDurations gives seven lines in eight a duration_ms: 0 to 2.5 s, 17
// in 800 lines exactly slow-calls' threshold, 3 in 800 a bad value. It
// draws from a generator of its own, so the failures are generate's.
func withDurations(inputs []vector.Input, seed uint64) []line {
	rng := rand.New(rand.NewPCG(seed^0x5eed, seed))
	out := make([]line, len(inputs))
	for i, in := range inputs {
		out[i].Input = in
		switch r := rng.IntN(800); {
		case r < 100:
		case r < 103:
			out[i].Duration = []any{-1, 1.5, "10"}[r-100]
		case r < 120:
			out[i].Duration = int64(2000) // the slow threshold: not slow
		default:
			out[i].Duration = rng.Int64N(2500)
		}
	}
	return out
}

func generate(n int, seed uint64) []vector.Input {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	pick := func(xs ...string) string { return xs[rng.IntN(len(xs))] }
	now := int64(1767225600000)
	out := make([]vector.Input, n)
	for i := range out {
		now += rng.Int64N(400)
		in := vector.Input{Attempt: 1 + rng.Int64N(12), NowMs: now, ElapsedMs: rng.Int64N(900_000), Random: vector.Float(rng.Float64())}
		switch rng.IntN(5) {
		case 0:
			in.HTTPStatus = []int{400, 404, 408, 409, 429, 500, 501, 502, 503, 504, 599}[rng.IntN(11)]
		case 1:
			in.GRPCCode = vector.GRPCCode(1 + rng.IntN(16))
		case 2:
			in.ErrorKind = pick("timeout", "connection_refused", "connection_reset", "dns_temporary", "parse_error", "rate_limited", "mystery")
		case 3:
			in.HTTPStatus, in.ErrorKind = 503, "timeout"
		}
		switch rng.IntN(8) {
		case 0:
			in.RetryAfter = fmt.Sprint(rng.IntN(200))
		case 1:
			in.RetryAfter = pick("garbage", "-3", "9999999999", "Thu, 01 Jan 2026 00:01:00 GMT", "Wed, 31 Dec 2025 23:00:00 GMT")
		case 2:
			in.RetryPushback = fmt.Sprint(rng.IntN(5000) - 100)
		}
		if rng.IntN(3) == 0 {
			in.Method = pick("GET", "POST", "PUT", "PATCH", "DELETE", "post")
			if rng.IntN(2) == 0 {
				in.IdempotencyKey = fmt.Sprintf("k%d", i)
			}
		}
		switch rng.IntN(40) {
		case 0:
			in.Attempt = []int64{0, -1, 1 << 40, math.MaxInt64}[rng.IntN(4)]
		case 1:
			in.Random = vector.Float([]float64{math.NaN(), math.Inf(1), math.Inf(-1), -0.5, 1.5}[rng.IntN(5)])
		case 2:
			in.PrevDelayMs = rng.Int64N(1 << 50)
		case 3:
			in.HTTPStatus = 700
		}
		out[i] = in
	}
	return out
}

func TestAllHostsDecideIdentically(t *testing.T) {
	node := requireTool(t, "node", "Node.js runs sdk/node")
	python := filepath.Join(root, ".venv", "bin", "python")
	if _, err := os.Stat(python); err != nil {
		t.Fatalf("%s missing: run `make test`, which creates the virtualenv with the Python host", python)
	}
	inputs := withDurations(generate(10_000, 2026), 2026)
	var lines bytes.Buffer
	for _, in := range inputs {
		b, err := in.marshal()
		if err != nil {
			t.Fatal(err)
		}
		lines.Write(b)
		lines.WriteByte('\n')
	}
	dir := t.TempDir()
	ctx := context.Background()
	rt, err := host.New(ctx, host.WithPoolSize(1))
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)

	for name, src := range policies {
		t.Run(name, func(t *testing.T) {
			arg := src
			if src != "default" {
				arg = filepath.Join(dir, name+".policy")
				os.WriteFile(arg, []byte(src), 0o644)
			}
			want := goAnswers(t, rt, []byte(src), inputs)
			if name == slowCalls {
				opensOnSlowCalls(t, rt, []byte(src), inputs, want)
			}
			java := javaDecide(t)
			answers := map[string][]string{
				"node":   run(t, lines.Bytes(), node, filepath.Join(root, "sdk/node/bin/backstop-decide.js"), "--policy", arg),
				"python": run(t, lines.Bytes(), python, "-m", "backstop", "decide", "--policy", arg),
				"java":   run(t, lines.Bytes(), java[0], append(java[1:], "--policy", arg)...),
			}
			for hostName, got := range answers {
				if len(got) != len(want) {
					t.Fatalf("%s answered %d lines for %d failures", hostName, len(got), len(want))
				}
				diffs := 0
				for i := range want {
					if got[i] != want[i] {
						if diffs++; diffs <= 5 {
							in, _ := inputs[i].marshal()
							t.Errorf("%s, failure %d %s:\n  go:  %s\n  %s: %s", hostName, i, in, want[i], hostName, got[i])
						}
					}
				}
				if diffs > 0 {
					t.Errorf("%s differs from Go on %d of %d failures", hostName, diffs, len(want))
				}
			}
		})
	}
}

// opensOnSlowCalls fails unless the slow-call rate opens the breaker:
// some line is refused as circuit_open that is not when the durations are
// left out. A host that ignored duration_ms would answer as without them.
func opensOnSlowCalls(t *testing.T, rt *host.Runtime, src []byte, inputs []line, want []string) {
	t.Helper()
	bare := make([]line, len(inputs))
	for i, in := range inputs {
		bare[i].Input = in.Input
	}
	without := goAnswers(t, rt, src, bare)
	slow, open := 0, 0
	for i := range want {
		if strings.Contains(want[i], `"circuit_open"`) {
			open++
			if want[i] != without[i] {
				slow++
			}
		}
	}
	t.Logf("%s: %d of %d answers circuit_open, %d of them only because of the lines' durations", slowCalls, open, len(want), slow)
	if slow == 0 {
		t.Fatalf("the slow-call rate never opened the breaker: no circuit_open answer owes to duration_ms")
	}
}

// goAnswers decides through the Go host and formats like `backstop decide`:
// a line's duration_ms, when valid, is recorded before its failure is
// decided (vector.DecodeCallLine has the rules; the generated lines' now_ms
// are all valid).
func goAnswers(t *testing.T, rt *host.Runtime, src []byte, inputs []line) []string {
	p, err := rt.Load(context.Background(), src)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	out := make([]string, len(inputs))
	for i, in := range inputs {
		var d policy.Decision
		var err error
		switch ms, ok := in.Duration.(int64); {
		case in.Duration == nil:
		case !ok:
			err = &policy.InputError{Field: vector.DurationField, Reason: badDuration[fmt.Sprint(in.Duration)]}
		default:
			err = p.RecordDuration(context.Background(), in.NowMs, ms)
		}
		if err == nil {
			d, err = p.Decide(context.Background(), in.Failure())
		}
		e := vector.FromDecision(d, err)
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false) // as `backstop decide` writes it
		if err != nil {
			enc.Encode(map[string]string{"error": e.Error})
		} else {
			enc.Encode(e)
		}
		out[i] = strings.TrimSuffix(b.String(), "\n")
	}
	return out
}

// badDuration: what every command answers to withDurations' bad values.
var badDuration = map[string]string{
	"-1":  "must be >= 0 (got -1)",
	"1.5": "must be an integer (got 1.5)",
	"10":  "must be an integer (got a string)",
}

func run(t *testing.T, stdin []byte, name string, args ...string) []string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Stdin = bytes.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, stderr.String())
	}
	return strings.Split(strings.TrimRight(string(out), "\n"), "\n")
}

// javaDecide returns the argv of the Java host's decide command
// (sdk/java, dev.backstop.Main), building its jar with Maven once per test
// binary (javatest.Build) so the jar is never stale. java and mvn must be
// installed (`make deps`): without them the test fails, it does not skip.
func javaDecide(t *testing.T) []string {
	t.Helper()
	target := javatest.Build(t)
	return []string{javatest.Java(t), "-jar", filepath.Join(target, "backstop-policy.jar"), "decide"}
}

func requireTool(t *testing.T, name, why string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not found (%s): install it, or run `make test`", name, why)
	}
	return path
}
