package policy

import "strings"

// Lint is a warning about a valid policy: a choice the retry guidance
// names as a classic mistake. A policy with lints still loads and decides
// as written; `backstop policy check` prints them, and with --strict fails.
// Every host reports the same lints (contract/abi.json's lints table holds
// their codes, fields and reasons).
type Lint struct {
	Code    string `json:"code"`    // stable: BP001…, listed in docs/policy.md ("Lints")
	Field   string `json:"field"`   // the field path that makes it fire, as errors name it
	Message string `json:"message"` // one line: what the policy does and the rule it breaks
}

func (l Lint) String() string { return l.Field + ": " + l.Code + ": " + l.Message }

// maxRetriesWithoutReason is the guidance's "more than 10 retries needs a
// reason": max_attempts counts the first execution, so 11 attempts pass.
const maxRetriesWithoutReason = 10

// Lints returns the policy's lints, ordered by code, leaving out those its
// lint_ignore silences. A policy that never retries (max_attempts 1) has
// none: every rule is about retries.
func (p *Policy) Lints() []Lint { return LintsOf(p.LintBits()) }

// LintsOf spells out lint bits as LintBits (and the module's policy_lints)
// return them: bit i is row i of contract/abi.json's lints table.
func LintsOf(bits uint64) []Lint {
	var out []Lint
	for i := range lintCodes {
		if bits&(1<<i) != 0 {
			out = append(out, Lint{Code: lintCodes[i], Field: lintFields[i], Message: lintReasons[i]})
		}
	}
	return out
}

// LintBits returns the policy's lints as bits, bit i for row i of
// contract/abi.json's lints table, what the module's policy_lints returns.
// It carries no text, so backstop.wasm carries none either.
func (p *Policy) LintBits() uint64 {
	if p.maxAttempts == 1 {
		return 0
	}
	var bits uint64
	if p.strategy == strategyNone {
		bits |= lintImmediateRetryBit
	} else if p.jitter == jitterNone {
		bits |= lintNoJitterBit
	}
	if p.maxAttempts == 0 || p.maxAttempts-1 > maxRetriesWithoutReason {
		bits |= lintManyAttemptsBit
	}
	if p.strategy != strategyNone && p.attemptTimeoutMs > 0 && p.attemptTimeoutMs > p.firstBackoffMs() {
		bits |= lintTimeoutPastBackoffBit
	}
	if p.connectTimeoutMs > 0 && p.attemptTimeoutMs > 0 && p.connectTimeoutMs >= p.attemptTimeoutMs {
		bits |= lintConnectPastAttemptBit
	}
	if p.defaultClass != Permanent {
		if limit := p.unknownAttempts(); limit == 0 || limit > 2 {
			bits |= lintUnknownRetriedBit
		}
	}
	for i, code := range lintCodes {
		if _, ok := p.lintIgnore[code]; ok {
			bits &^= 1 << i
		}
	}
	return bits
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

// lintCodeList is lint_ignore's codes for its error message.
func lintCodeList() string { return strings.Join(lintCodes[:], ", ") }
