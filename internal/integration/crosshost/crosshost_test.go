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
	inputs := generate(10_000, 2026)
	var lines bytes.Buffer
	for _, in := range inputs {
		b, err := json.Marshal(in)
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
							in, _ := json.Marshal(inputs[i])
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

// goAnswers decides through the Go host and formats like `backstop decide`.
func goAnswers(t *testing.T, rt *host.Runtime, src []byte, inputs []vector.Input) []string {
	p, err := rt.Load(context.Background(), src)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	out := make([]string, len(inputs))
	for i, in := range inputs {
		d, err := p.Decide(context.Background(), in.Failure())
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
