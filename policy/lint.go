package policy

import "sort"

// Lint is a warning about a valid policy: a choice the retry guidance
// names as a classic mistake. A policy with lints still loads and decides
// as written; `backstop policy check` prints them, and with --strict fails.
type Lint struct {
	Code    string // stable: BP001…, listed in docs/policy.md ("Lints")
	Field   string // the field path that makes it fire, as errors name it
	Message string // one line: what the policy does and the rule it breaks
}

func (l Lint) String() string { return l.Field + ": " + l.Code + ": " + l.Message }

// The lint codes. A policy silences one with a stated reason:
// lint_ignore: {BP003: "nightly batch, 24h budget"}.
const (
	LintImmediateRetry     = "BP001" // backoff.strategy none with retries
	LintNoJitter           = "BP002" // jitter.mode none with a backoff
	LintManyAttempts       = "BP003" // more than 10 retries
	LintTimeoutPastBackoff = "BP004" // attempt_timeout longer than the first backoff
	LintUnknownRetried     = "BP005" // unknown errors retried more than once
	LintConnectPastAttempt = "BP006" // connect_timeout not shorter than attempt_timeout
)

// lintCodes are the codes lint_ignore accepts.
var lintCodes = []string{LintImmediateRetry, LintNoJitter, LintManyAttempts, LintTimeoutPastBackoff, LintUnknownRetried, LintConnectPastAttempt}

// maxRetriesWithoutReason is the guidance's "more than 10 retries needs a
// reason": max_attempts counts the first execution, so 11 attempts pass.
const maxRetriesWithoutReason = 10

// Lints returns the policy's lints, ordered by code, leaving out those its
// lint_ignore silences. A policy that never retries (max_attempts 1) has
// none: every rule is about retries.
func (p *Policy) Lints() []Lint {
	var out []Lint
	add := func(code, field, msg string) {
		if _, ok := p.lintIgnore[code]; !ok {
			out = append(out, Lint{Code: code, Field: field, Message: msg})
		}
	}
	if p.maxAttempts == 1 {
		return nil
	}
	if p.strategy == strategyNone {
		add(LintImmediateRetry, "backoff.strategy",
			"strategy none retries at once: an immediate retry hits a failing dependency again while it is down; use a backoff (exponential)")
	} else if p.jitter == jitterNone {
		add(LintNoJitter, "jitter.mode",
			"jitter none with "+strategyNames[p.strategy]+" backoff: clients that failed together retry together; backoff without jitter is the classic herd, use full")
	}
	switch {
	case p.maxAttempts == 0:
		add(LintManyAttempts, "max_attempts",
			"unlimited attempts (only max_elapsed stops them): more than "+itoa(maxRetriesWithoutReason)+" retries needs a reason; state it in lint_ignore.BP003")
	case p.maxAttempts-1 > maxRetriesWithoutReason:
		add(LintManyAttempts, "max_attempts",
			itoa(p.maxAttempts)+" attempts are "+itoa(p.maxAttempts-1)+" retries: more than "+itoa(maxRetriesWithoutReason)+" retries needs a reason; state it in lint_ignore.BP003")
	}
	if p.strategy != strategyNone && p.attemptTimeoutMs > 0 && p.attemptTimeoutMs > p.firstBackoffMs() {
		add(LintTimeoutPastBackoff, "attempt_timeout",
			"attempt_timeout "+ms(p.attemptTimeoutMs)+" is longer than the first backoff ("+ms(p.firstBackoffMs())+"): keep timeouts much shorter than the backoff cycle, or hung attempts, not the backoff, pace the retries")
	}
	if p.connectTimeoutMs > 0 && p.attemptTimeoutMs > 0 && p.connectTimeoutMs >= p.attemptTimeoutMs {
		add(LintConnectPastAttempt, "connect_timeout",
			"connect_timeout "+ms(p.connectTimeoutMs)+" is not shorter than attempt_timeout ("+ms(p.attemptTimeoutMs)+"): the attempt's deadline ends a slow connect first, as a timeout, so connect_timeout never applies; keep it a fraction of attempt_timeout")
	}
	if p.defaultClass != Permanent {
		if limit := p.unknownAttempts(); limit == 0 || limit > 2 {
			what := "up to " + itoa(limit-1) + " times"
			if limit == 0 {
				what = "without an attempt limit"
			}
			add(LintUnknownRetried, "classify.default",
				"a failure no table knows is "+classNames[p.defaultClass]+" and retried "+what+": default is no retry; make it permanent, or classify the errors you know")
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Code < out[j].Code })
	return out
}

// firstBackoffMs is the wait before the first retry before jitter: base,
// capped (decorrelated draws from base up).
func (p *Policy) firstBackoffMs() int64 { return min(p.baseMs, p.capMs) }

// unknownAttempts is how many attempts a failure of the default class
// gets, 0 when only max_elapsed limits them. uncertainMaxAttempts is
// already capped at max_attempts.
func (p *Policy) unknownAttempts() int64 {
	if p.defaultClass == Uncertain {
		return p.uncertainMaxAttempts
	}
	return p.maxAttempts
}

func isLintCode(s string) bool {
	for _, c := range lintCodes {
		if c == s {
			return true
		}
	}
	return false
}
