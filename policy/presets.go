package policy

import "sort"

// presets are policy files for common workloads (after Cloud Tasks' retry
// guidance). They are parsed like any file, so they validate the same way.
var presets = map[string]string{
	// default: exponential from 1s to a 300s cap with full jitter, 5 attempts.
	"default": `name: default
max_attempts: 5
backoff: {strategy: exponential, base: 1s, multiplier: 2, cap: 300s}
jitter: {mode: full}
`,
	// critical: a user is waiting; fail fast.
	"critical": `name: critical
max_attempts: 3
max_elapsed: 10s
backoff: {strategy: exponential, base: 100ms, multiplier: 2, cap: 2s}
jitter: {mode: full}
retry_after: {cap: 5s, on_exceed: give_up}
`,
	// batch: nobody is waiting; keep trying for a day, at most hourly.
	"batch": `name: batch
max_attempts: 25
max_elapsed: 24h
uncertain: {max_attempts: 3}
backoff: {strategy: exponential, base: 10s, multiplier: 2, cap: 1h}
jitter: {mode: full}
retry_after: {cap: 6h, on_exceed: clamp}
lint_ignore:
  BP003: "nobody is waiting: 25 attempts spread over at most 24h (max_elapsed) ride out an outage of hours"
  BP005: "nobody is waiting: an uncertain failure (a 500, an unknown error) gets a second retry within the day"
`,
	// cloud-tasks: a Cloud Tasks queue's own retries, one to one: its
	// documented RetryConfig defaults (maxAttempts 100, minBackoff 0.1s,
	// maxBackoff 3600s, maxDoublings 16, maxRetryDuration 0: no time
	// limit), no jitter, every response outside 2xx retried (400 and 401
	// included) and every failure without one (the built-in permanent error
	// kinds too: a caller's explicit "permanent" still stops), whatever the
	// method (a task is delivered at least once),
	// and its stop rule: with maxRetryDuration set too (max_elapsed), it
	// stops only when both are reached (stop_when: all).
	"cloud-tasks": `name: cloud-tasks
max_attempts: 100
stop_when: all
backoff: {strategy: cloud_tasks, base: 100ms, cap: 3600s, max_doublings: 16}
jitter: {mode: none}
classify:
  default: retryable
  http: {"3xx": retryable, "4xx": retryable, "5xx": retryable}
  error_kinds: {dns_not_found: retryable, invalid_input: retryable, parse_error: retryable, schema_mismatch: retryable}
idempotency:
  idempotent_methods: [GET, HEAD, OPTIONS, TRACE, PUT, DELETE, POST, PATCH]
lint_ignore:
  BP002: "Cloud Tasks adds no jitter: this is its schedule"
  BP003: "Cloud Tasks' default maxAttempts is 100"
  BP005: "Cloud Tasks retries every failed dispatch, whatever the error"
`,
	// fast-transient: blips such as a leader election; retry quickly, briefly.
	"fast-transient": `name: fast-transient
max_attempts: 6
max_elapsed: 5s
backoff: {strategy: exponential, base: 20ms, multiplier: 2, cap: 1s}
jitter: {mode: equal}
retry_after: {cap: 2s, on_exceed: give_up}
`,
}

// PresetNames lists the preset names, sorted.
func PresetNames() []string {
	names := make([]string, 0, len(presets))
	for n := range presets {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// PresetText returns the policy file of a named preset.
func PresetText(name string) (string, bool) {
	t, ok := presets[name]
	return t, ok
}
