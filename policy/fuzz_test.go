package policy_test

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/backstop-dev/backstop/internal/abi"
	"github.com/backstop-dev/backstop/policy"
)

// FuzzParse: any bytes give a Policy or an *Error whose problems each name
// a field; never a panic.
func FuzzParse(f *testing.F) {
	for _, name := range policy.PresetNames() {
		text, _ := policy.PresetText(name)
		f.Add([]byte(text))
	}
	for _, s := range []string{
		`{"backoff": {"base": "1s", "cap": "100ms"}}`,
		`{"retry_budget": {"type": "ratio", "window": "5s"}, "circuit_breaker": {}}`,
		`{"classify": {"http": {"5xx": "permanent", "503": "retryable"}, "grpc": {"14": "permanent"}}}`,
		"max_attempts: 3\nbackoff: {strategy: decorrelated}\njitter: {mode: decorrelated}\n",
		`{"extends": "batch", "max_elapsed": "1h"}`, "&a [*a]", "{", "null", "- - -",
		// YAML features: documents, merge keys, odd keys; aliases and tags (refused).
		"max_attempts: 3\n---\nmax_attempts: 4\n", "max_attempts: 3\n...\n# end\n", "--- {max_attempts: 3}\n",
		"max_attempts: &n 3\nuncertain: {max_attempts: *n}\n",
		"backoff: &b {base: 1s, cap: 2s}\ncircuit_breaker: {<<: *b}\njitter: {<<: [{mode: none}, {mode: full}]}\n",
		"backoff: &x\n  <<: *x\n", "classify: {grpc: {<<: {UNAVAILABLE: permanent}, \"14\": retryable}}",
		"max_attempts: !!binary AAA=\nname: !!str 3\nbackoff: !!set {base}\n", "max_attempts: 0x10\n",
		"? [a]\n: 1\n", "name: <<\n",
		// Past the limits: a long list, many unknown keys, huge durations.
		"idempotency: {idempotent_methods: [" + strings.Repeat("A,", 101) + "]}\n",
		"{" + strings.Repeat("a: 0,", 30) + "}",
		"backoff: {base: 2562047h, cap: 2562047h}\nmax_elapsed: 2562047h\nmax_attempts: 0\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := policy.Parse(data)
		if err != nil {
			var pe *policy.Error
			if !errors.As(err, &pe) || len(pe.Problems) == 0 || len(pe.Problems) > policy.MaxProblems {
				t.Fatalf("error %v is not an *Error with 1..%d problems", err, policy.MaxProblems)
			}
			for _, pr := range pe.Problems {
				if pr.Field == "" || pr.Reason == "" {
					t.Fatalf("problem without field or reason: %+v", pr)
				}
			}
			return
		}
		// A policy that parses decides sanely.
		d, err := p.Decide(policy.Failure{Attempt: 3, HTTPStatus: 503, Random: 0.5, NowMs: 1767225600000})
		if err != nil || d.DelayMs < 0 {
			t.Fatalf("Decide: %+v, %v", d, err)
		}
	})
}

// FuzzDecide: any failure gives an *InputError or a decision whose delay is
// in [0, cap], whose reason goes with its action, and which respects the
// limits.
func FuzzDecide(f *testing.F) {
	f.Add(int64(1), 503, 0, "", "", "", "GET", "", int64(0), int64(0), 0.5, int64(0))
	f.Add(int64(1e9), 429, 0, "", "9999999999", "", "POST", "k", int64(1<<62), int64(1767225600000), math.NaN(), int64(-1))
	f.Add(int64(0), 0, 14, "timeout", "Thu, 01 Jan 2026 00:00:45 GMT", "250", "PATCH", "", int64(5), int64(1767225600000), math.Inf(1), int64(math.MaxInt64))
	f.Add(int64(math.MaxInt64), 500, 13, "connection_refused", "-1", "x", "", "", int64(0), int64(0), -1.0, int64(0))
	pols := []*policy.Policy{}
	for _, src := range []string{
		`{"max_attempts": 6, "max_elapsed": "40s", "backoff": {"base": "100ms", "cap": "10s"}}`,
		`{"max_attempts": 0, "max_elapsed": "1h", "backoff": {"strategy": "decorrelated", "base": "1s", "cap": "1m"}, "jitter": {"mode": "decorrelated"}, "retry_after": {"mode": "hint", "on_exceed": "clamp", "cap": "30s"}}`,
		`{"retry_budget": {"type": "ratio"}, "circuit_breaker": {"failure_threshold": 2}, "jitter": {"mode": "proportional", "ratio": 1}}`,
	} {
		pols = append(pols, mustParse(f, src))
	}
	caps := []int64{10_000, 60_000, 300_000}
	f.Fuzz(func(t *testing.T, attempt int64, status, grpc int, kind, retryAfter, pushback, method, key string, elapsed, now int64, random float64, prev int64) {
		fl := policy.Failure{Attempt: attempt, HTTPStatus: status, GRPCCode: grpc, ErrorKind: kind,
			RetryAfter: retryAfter, RetryPushback: pushback, Method: method, IdempotencyKey: key,
			ElapsedMs: elapsed, NowMs: now, Random: random, PrevDelayMs: prev}
		for i, p := range pols {
			d, err := p.Decide(fl)
			if err != nil {
				var ie *policy.InputError
				if !errors.As(err, &ie) {
					t.Fatalf("error %v is not an *InputError", err)
				}
				continue
			}
			maxDelay := max(caps[i], policy.MaxHintMs)
			if d.DelayMs < 0 || d.DelayMs > maxDelay {
				t.Fatalf("policy %d: delay %d out of range for %+v", i, d.DelayMs, fl)
			}
			if d.Reason != policy.RetryAfterHint && d.DelayMs > caps[i] {
				t.Fatalf("policy %d: computed delay %d above the cap for %+v", i, d.DelayMs, fl)
			}
			isRetryReason := d.Reason <= policy.UncertainRetry
			if (d.Action == policy.Retry) != isRetryReason {
				t.Fatalf("policy %d: action %s with reason %s", i, d.Action, d.Reason)
			}
			if d.Action == policy.DeadLetter && d.DelayMs != 0 {
				t.Fatalf("dead letter with a delay: %+v", d)
			}
			if i == 0 && d.Action == policy.Retry && (elapsed+d.DelayMs > 40_000 || attempt >= 6) {
				t.Fatalf("retry past a limit: %+v for %+v", d, fl)
			}
			if got := abi.UnpackDecision(abi.PackDecision(d)); got != d || abi.PackDecision(d) < 0 {
				t.Fatalf("Pack/Unpack: %+v -> %d -> %+v", d, abi.PackDecision(d), got)
			}
		}
	})
}
