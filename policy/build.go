package policy

import (
	"strconv"
	"strings"
)

type hintMode uint8

const (
	hintMax  hintMode = iota // delay = max(hint, computed)
	hintOnly                 // delay = hint
)

var hintModeNames = []string{"max", "hint"}

type onExceed uint8

const (
	exceedGiveUp onExceed = iota
	exceedClamp
	exceedIgnore
)

var onExceedNames = []string{"give_up", "clamp", "ignore"}

// stopWhenNames: "any" stops at the first limit reached (before a retry
// would be due past max elapsed); "all" only once every limit set has
// passed, checked at the failure: Cloud Tasks' rule for max_attempts
// with max_retry_duration.
var stopWhenNames = []string{"any", "all"}

func indexOf(names []string, s string) int {
	for i, n := range names {
		if n == s {
			return i
		}
	}
	return 0
}

func ms(v int64) string { return durationString(v * 1e6) }

// build checks the rules that span fields and turns a rawPolicy into a
// Policy.
//
// It is two functions, not one, for start-up in V8 (Node.js): Go compiles
// a function's jumps to wasm as branches back to one loop around its body,
// and V8 counts each by its distance from the loop's start towards tiering
// the function up, so one long function with many ifs, run once per load,
// got recompiled by the optimizing compiler (tens of ms of CPU) after a few
// lines were added (BENCHMARKS.md, issue 41).
func (d *decoder) build(r *rawPolicy) (*Policy, error) {
	strat := strategy(indexOf(strategyNames, r.strategy))
	jit := jitterMode(indexOf(jitterNames, r.jitter))
	d.check(r, strat, jit)
	if len(d.problems) > 0 {
		return nil, &Error{Problems: d.problems, More: d.more}
	}
	return newPolicy(r, strat, jit), nil
}

// check records the problems of the rules that span fields.
func (d *decoder) check(r *rawPolicy, strat strategy, jit jitterMode) {
	if strat != strategyNone && r.baseMs == 0 {
		d.fail("backoff.base", "must be > 0 for strategy "+r.strategy)
	}
	if strat == strategyCloudTasks && r.multMilli != 2000 {
		// Cloud Tasks doubles: a multiplier would make it another schedule.
		d.fail("backoff.multiplier", "must be 2 with strategy cloud_tasks, which doubles (got "+fmtFixed(r.multMilli, 3)+")")
	}
	if r.capMs < r.baseMs {
		d.fail("backoff.cap", "must be >= backoff.base (got "+ms(r.capMs)+" < "+ms(r.baseMs)+")")
	}
	if (jit == jitterDecorrelated) != (strat == strategyDecorrelated) && !(strat == strategyDecorrelated && jit == jitterNone) {
		d.fail("jitter.mode", "decorrelated jitter goes with the decorrelated strategy only: use backoff.strategy decorrelated with jitter.mode decorrelated or none (got strategy "+r.strategy+", jitter "+r.jitter+")")
	}
	if jit == jitterProportional && r.ratioPPM == 0 {
		d.fail("jitter.ratio", "must be > 0 with jitter.mode proportional")
	}
	if r.maxAttempts == 0 && r.maxElapsedMs == 0 {
		d.fail("max_attempts", "must be >= 1 unless max_elapsed is set (0 means unlimited attempts)")
	}
	if b := r.budget; b != nil {
		switch b.kind {
		case "token_bucket":
			if b.tokenRatioMilli > b.maxTokensMilli {
				d.fail("retry_budget.token_ratio", "must be <= retry_budget.max_tokens")
			}
		case "ratio":
			if b.windowMs < 1000 || b.windowMs > maxWindowSec*1000 || b.windowMs%1000 != 0 {
				d.fail("retry_budget.window", "must be a whole number of seconds in 1s.."+itoa(maxWindowSec)+"s (got "+ms(b.windowMs)+")")
			}
		}
	}
	if c := r.circuit; c != nil {
		if c.openForMs == 0 {
			d.fail("circuit_breaker.open_for", "must be > 0")
		}
		checkCircuitKind(d, c)
	}
}

// newPolicy turns a checked rawPolicy into a Policy.
func newPolicy(r *rawPolicy, strat strategy, jit jitterMode) *Policy {
	p := &Policy{
		name:                 r.name,
		maxAttempts:          r.maxAttempts,
		uncertainMaxAttempts: r.uncertainMaxAttempts,
		maxElapsedMs:         r.maxElapsedMs,
		attemptTimeoutMs:     r.attemptTimeoutMs,
		connectTimeoutMs:     r.connectTimeoutMs,
		stopAll:              r.stopWhen == "all",
		strategy:             strat,
		baseMs:               r.baseMs,
		capMs:                r.capMs,
		multMilli:            r.multMilli,
		maxDoublings:         r.maxDoublings,
		jitter:               jit,
		ratioPPM:             r.ratioPPM,
		hintHonor:            r.hintHonor,
		hintMode:             hintMode(indexOf(hintModeNames, r.hintMode)),
		hintCapMs:            r.hintCapMs,
		hintOnExceed:         onExceed(indexOf(onExceedNames, r.hintOnExceed)),
		defaultClass:         Class(indexOf(classNames[:], r.defaultClass)),
		kinds:                map[string]Class{},
		neverSent:            map[string]bool{},
		lintIgnore:           r.lintIgnore,
	}
	if p.maxAttempts > 0 && p.uncertainMaxAttempts > p.maxAttempts {
		p.uncertainMaxAttempts = p.maxAttempts
	}
	defaultTables(p)
	// Ranges first, then exact codes, so "5xx: permanent" with "503:
	// retryable" means what it says whatever the order in the file.
	for _, ru := range r.http {
		if lo, ok := strings.CutSuffix(ru.key, "xx"); ok {
			c := uint8(indexOf(classNames[:], ru.class)) + 1
			start := int(lo[0]-'0') * 100
			for s := start; s < start+100; s++ {
				p.http[s] = c
			}
		}
	}
	for _, ru := range r.http {
		if n, err := strconv.Atoi(ru.key); err == nil {
			p.http[n] = uint8(indexOf(classNames[:], ru.class)) + 1
		}
	}
	for _, ru := range r.grpc {
		n, _ := strconv.Atoi(ru.key)
		p.grpc[n] = uint8(indexOf(classNames[:], ru.class)) + 1
	}
	for _, ru := range r.kinds {
		p.kinds[ru.key] = Class(indexOf(classNames[:], ru.class))
	}
	p.idempotentMethods = append([]string(nil), r.idempotentMethods...)
	for _, k := range r.neverSent {
		p.neverSent[k] = true
	}
	if b := r.budget; b != nil {
		p.budget = &budget{bucket: b.kind == "token_bucket",
			maxMilli: b.maxTokensMilli, ratioMill: b.tokenRatioMilli, tokens: b.maxTokensMilli,
			ratioPPM: b.ratioPPM, windowSec: b.windowMs / 1000, minPerSec: b.minRetriesPerSecond}
	}
	if c := r.circuit; c != nil {
		p.circuit = &circuit{threshold: c.failureThreshold, openMs: c.openForMs, needSuccesses: c.halfOpenSuccesses,
			maxTrials: c.halfOpenMaxCalls}
		if c.kind == "failure_rate" {
			p.circuit.rate = newRateWindow(c.windowByTime, c.windowSize, c.minimumCalls, c.rateThresholdPct)
			if c.slowRatePct > 0 {
				p.circuit.slow = newRateWindow(c.windowByTime, c.windowSize, c.minimumCalls, c.slowRatePct)
				p.circuit.slowMs = c.slowMs
			}
		}
	}
	p.stateful = p.budget != nil || p.circuit != nil
	p.onOpen = r.onOpen
	p.retryDownstream = r.retriedDownstream == DownstreamRetry
	p.fastPath = strat == strategyExponential && p.multMilli == 2000 && jit == jitterFull && !p.stopAll
	return p
}

// checkCircuitKind refuses the fields of the other kind of breaker, so a
// file never believes it set what does not apply, and settles
// minimum_calls.
func checkCircuitKind(d *decoder, c *rawCircuit) {
	if c.kind != "failure_rate" {
		for _, f := range []string{"failure_rate_threshold", "sliding_window", "minimum_calls", "slow_call_rate_threshold", "slow_call_duration_threshold"} {
			if c.set[f] {
				d.fail("circuit_breaker."+f, "applies to type failure_rate only (add type: failure_rate; the default, consecutive, counts failure_threshold failures in a row)")
			}
		}
		return
	}
	if c.set["failure_threshold"] {
		d.fail("circuit_breaker.failure_threshold", "applies to type consecutive only: a failure_rate breaker opens at failure_rate_threshold percent")
	}
	// Both or neither: a threshold without its duration (or the reverse)
	// would silently measure nothing.
	switch rate, dur := c.set["slow_call_rate_threshold"], c.set["slow_call_duration_threshold"]; {
	case rate && !dur:
		d.fail("circuit_breaker.slow_call_duration_threshold", "required with slow_call_rate_threshold: how long a call must take to count as slow (such as 2s)")
	case dur && !rate:
		d.fail("circuit_breaker.slow_call_rate_threshold", "required with slow_call_duration_threshold: the percentage of slow calls (1..100) that opens the breaker")
	case dur && c.slowMs == 0: // -1: reported by duration
		d.fail("circuit_breaker.slow_call_duration_threshold", "must be > 0")
	}
	if c.minimumCalls == 0 {
		c.minimumCalls = 100 // Resilience4j's minimumNumberOfCalls
		if !c.windowByTime {
			c.minimumCalls = min(100, c.windowSize)
		}
	}
	if !c.windowByTime && c.minimumCalls > c.windowSize {
		d.fail("circuit_breaker.minimum_calls", "must be <= sliding_window.size (got "+itoa(c.minimumCalls)+" > "+itoa(c.windowSize)+"): a window of "+itoa(c.windowSize)+" calls never holds more")
	}
}

// defaultTables fills the classification tables with backstop's defaults.
func defaultTables(p *Policy) {
	const r, pe, u = uint8(Retryable) + 1, uint8(Permanent) + 1, uint8(Uncertain) + 1
	for s := 400; s < 500; s++ {
		p.http[s] = pe
	}
	for s := 500; s < 600; s++ {
		p.http[s] = u
	}
	for _, s := range []int{408, 429, 502, 503, 504} {
		p.http[s] = r
	}
	p.http[501], p.http[505] = pe, pe
	for code, c := range map[int]uint8{
		1: pe, 2: u, 3: pe, 4: r, 5: pe, 6: pe, 7: pe, 8: r,
		9: pe, 10: r, 11: pe, 12: pe, 13: u, 14: r, 15: pe, 16: pe,
	} {
		p.grpc[code] = c
	}
	for k, c := range map[string]Class{
		"timeout": Retryable, "connect_timeout": Retryable, "connection_refused": Retryable,
		"connection_reset": Retryable, "dns_temporary": Retryable, "deadlock": Retryable,
		"lock_timeout": Retryable, "dns_not_found": Permanent,
		"invalid_input": Permanent, "parse_error": Permanent, "schema_mismatch": Permanent,
		// The class names as kinds, for hosts whose callers name a class
		// (an exception type mapped to "permanent", say).
		"retryable": Retryable, "permanent": Permanent, "uncertain": Uncertain,
	} {
		p.kinds[k] = c
	}
}
