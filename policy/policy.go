package policy

import "sync"

// Policy is a parsed, validated retry policy together with its retry-budget
// and circuit-breaker state. Build one with Parse or Preset; each call
// returns a new Policy with its own state, so two policies never share a
// budget or a breaker by accident.
//
// A Policy is safe for concurrent use. Policies without a budget or a
// breaker take no lock.
type Policy struct {
	name string

	maxAttempts          int64 // 0: unlimited (max elapsed is then set)
	uncertainMaxAttempts int64
	maxElapsedMs         int64 // 0: none
	attemptTimeoutMs     int64 // 0: none
	connectTimeoutMs     int64 // 0: none (the client's own)
	stopAll              bool  // stop_when all: only once every limit set has passed

	strategy     strategy
	baseMs       int64
	capMs        int64
	multMilli    int64 // multiplier × 1000
	maxDoublings int64
	jitter       jitterMode
	ratioPPM     int64 // proportional jitter ratio × 1e6

	hintHonor    bool
	hintMode     hintMode
	hintCapMs    int64
	hintOnExceed onExceed

	http         [600]uint8 // class+1, 0: no opinion
	grpc         [17]uint8  // class+1, 0: no opinion
	kinds        map[string]Class
	defaultClass Class

	idempotentMethods []string
	neverSent         map[string]bool

	stateful bool       // budget or circuit set: decisions take mu
	fastPath bool       // exponential ×2 with full jitter: Decide's inline path
	mu       sync.Mutex // guards budget and circuit
	budget   *budget
	circuit  *circuit

	onOpen          string // OnOpenDefer or OnOpenDeadLetter
	retryDownstream bool   // retried_downstream: retry

	lintIgnore map[string]string // lint code → the reason the file states
}

// Name returns the policy's name ("" when the file gave none).
func (p *Policy) Name() string { return p.name }

// Stateful reports whether the policy has a retry budget or a circuit
// breaker, whose state every decision reads and updates.
func (p *Policy) Stateful() bool { return p.stateful }

// MaxAttempts returns the attempt limit counting the first execution
// (0: unlimited).
func (p *Policy) MaxAttempts() int64 { return p.maxAttempts }

// Decide returns the decision for one failure.
//
// # Errors
//
// Decide returns an *InputError, and changes no state, when a field of f is
// out of range: Attempt < 1, HTTPStatus neither 0 nor 100..599, GRPCCode
// outside 0..16, a negative ElapsedMs, NowMs or PrevDelayMs, or NowMs 0 on a
// stateful policy. Everything
// else (unknown methods or error kinds, garbage Retry-After values, a NaN
// Random) has a defined decision.
//
// # Notes
//
// The rules apply in a fixed order (docs/policy.md): the per-request ones
// first, then the shared state. The common path is written out in this one
// function because every call the compiler does not inline costs tens of
// nanoseconds in the WebAssembly build.
func (p *Policy) Decide(f Failure) (Decision, error) {
	if f.outOfRange() {
		return Decision{}, f.invalid()
	}
	if p.stateful && f.NowMs == 0 {
		// The budget's window and the breaker's timer run on now_ms: 0
		// ("unknown") would open the breaker for good.
		return Decision{}, inputError("now_ms", "must be set (Unix milliseconds) for a policy with a retry budget or a circuit breaker")
	}
	class := p.classify(&f)
	d := Decision{Action: DeadLetter, Class: class}
	if class == Permanent {
		// Permanent failures never touch the budget or the breaker: they say
		// nothing about the dependency's health. But the dependency answered,
		// so a half-open trial that ends this way gives its slot back
		// (unrecorded, as Resilience4j's ignored exceptions release their
		// permission) instead of holding it until open_for.
		if p.circuit != nil {
			p.mu.Lock()
			p.circuit.release(f.NowMs)
			p.mu.Unlock()
		}
		d.Reason = PermanentError
		return d, nil
	}
	switch {
	case f.RetriedDownstream && !p.retryDownstream:
		// Retry at one layer: a layer below retried and gave up.
		d.Reason = RetriedDownstream
	case f.ServerDeclined || (f.RetryPushback != "" && p.hintHonor && f.RetryAfter == "" && declines(f.RetryPushback)):
		d.Reason = ServerDeclined
	case f.Method != "" && !p.mayRetryRequest(&f):
		d.Reason = NotIdempotent
	case p.maxAttempts > 0 && f.Attempt >= p.maxAttempts && (!p.stopAll || p.elapsedPassed(&f)):
		d.Reason = MaxAttemptsReached
	case class == Uncertain && f.Attempt >= p.uncertainMaxAttempts:
		d.Reason = UncertainLimitReached
	case p.maxElapsedMs > 0 && f.ElapsedMs > p.maxElapsedMs && (!p.stopAll || p.maxAttempts == 0):
		d.Reason = MaxElapsedExceeded
	case p.fastPath && f.RetryAfter == "" && f.RetryPushback == "":
		// exponential ×2 with full jitter (the default preset) and no hint:
		// written out here so the WebAssembly build makes no further call.
		n := min(f.Attempt-1, p.maxDoublings)
		c := p.capMs
		if n < 63 && p.baseMs <= p.capMs>>n {
			c = min(p.baseMs<<n, p.capMs)
		}
		d = Decision{Action: Retry, DelayMs: scale(c, clampUnit(f.Random)), Class: class}
		if class == Uncertain {
			d.Reason = UncertainRetry
		}
		if p.maxElapsedMs > 0 && satAdd(f.ElapsedMs, d.DelayMs) > p.maxElapsedMs {
			d = Decision{Action: DeadLetter, Reason: MaxElapsedExceeded, Class: class}
		}
	default:
		d = p.delay(&f, class)
	}
	if p.stateful {
		p.mu.Lock()
		d = p.applyState(&f, d)
		p.mu.Unlock()
	}
	return d, nil
}

// delay computes the retry of a failure that passed the per-request rules:
// backoff, jitter, the server's hint, and the deadline.
func (p *Policy) delay(f *Failure, class Class) Decision {
	var computed int64
	if p.fastPath {
		// exponential ×2 with full jitter (the default preset), inline.
		n := min(f.Attempt-1, p.maxDoublings)
		d := p.capMs
		if n < 63 && p.baseMs <= p.capMs>>n {
			d = min(p.baseMs<<n, p.capMs)
		}
		computed = scale(d, clampUnit(f.Random))
	} else {
		computed = p.Backoff(f.Attempt, f.PrevDelayMs, f.Random)
	}
	delay, reason := computed, Transient
	if class == Uncertain {
		reason = UncertainRetry
	}
	if f.RetryAfter != "" || f.RetryPushback != "" {
		if hint, ok := p.hint(f); ok {
			if hint > p.hintCapMs {
				switch p.hintOnExceed {
				case exceedGiveUp:
					return Decision{Action: DeadLetter, Reason: RetryAfterTooLong, Class: class}
				case exceedClamp:
					hint = p.hintCapMs
				case exceedIgnore:
					ok = false
				}
			}
			// The hint is a floor: jitter never shortens what the server asked.
			if ok && (p.hintMode == hintOnly || hint >= computed) {
				delay, reason = hint, RetryAfterHint
			}
		}
	}
	// Stop before the deadline: a retry due after it is never scheduled.
	// (stop_when all retries until the deadline has passed, as Cloud Tasks
	// does, so it has no deadline to stop before.)
	if p.maxElapsedMs > 0 && !p.stopAll && satAdd(f.ElapsedMs, delay) > p.maxElapsedMs {
		r := MaxElapsedExceeded
		if reason == RetryAfterHint && satAdd(f.ElapsedMs, computed) <= p.maxElapsedMs {
			r = RetryAfterTooLong
		}
		return Decision{Action: DeadLetter, Reason: r, Class: class}
	}
	return Decision{Action: Retry, DelayMs: delay, Reason: reason, Class: class}
}

// applyState records a retryable or uncertain failure in the breaker and
// the budget, then lets a retry through only when the breaker is not open
// and the budget has room. Every such failure is recorded, retried or not:
// each one is evidence about the dependency.
func (p *Policy) applyState(f *Failure, d Decision) Decision {
	if p.circuit != nil {
		p.circuit.onFailure(f.NowMs)
	}
	if p.budget != nil {
		p.budget.onFailure(f.NowMs)
	}
	if d.Action != Retry {
		return d
	}
	if p.circuit != nil && p.circuit.state(f.NowMs) == BreakerOpen {
		return Decision{Action: DeadLetter, Reason: CircuitOpen, Class: d.Class}
	}
	if p.budget != nil && !p.budget.withdraw(f.NowMs) {
		// The backoff stays in DelayMs: a queue defers the job by it.
		return Decision{Action: DeadLetter, Reason: BudgetExhausted, Class: d.Class, DelayMs: d.DelayMs}
	}
	return d
}

// BudgetTokens returns what is left of the retry budget at nowMs, in
// milli-units: the tokens of a token bucket (retries are allowed while more
// than half of max_tokens remain), or the retries still allowed in the
// current window of a window budget. ok is false when the policy has no
// budget. It reads the state without changing it.
func (p *Policy) BudgetTokens(nowMs int64) (milli int64, ok bool) {
	if p.budget == nil {
		return 0, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.budget.available(nowMs), true
}

// RecordSuccess tells the budget and the breaker that a call succeeded at
// nowMs (Unix milliseconds). It does nothing on a stateless policy.
func (p *Policy) RecordSuccess(nowMs int64) {
	if !p.stateful {
		return
	}
	p.mu.Lock()
	if p.budget != nil {
		p.budget.onSuccess(nowMs)
	}
	if p.circuit != nil {
		p.circuit.onSuccess(nowMs)
	}
	p.mu.Unlock()
}

// RecordDuration tells the breaker how long a call that ended at nowMs
// (Unix milliseconds) took, in milliseconds, whether it succeeded or
// failed: a failure_rate breaker with slow_call_rate_threshold counts the
// calls longer than slow_call_duration_threshold in its window, and opens
// when their share reaches the threshold. Report each call once, before
// its RecordSuccess or Decide. It does nothing on a policy without a
// slow-call rate; a call whose duration is not reported is not counted.
//
// # Errors
//
// An InputError when durationMs is negative, or, on a policy with a
// slow-call rate, nowMs is not set (> 0); no state changes then.
func (p *Policy) RecordDuration(nowMs, durationMs int64) error {
	if durationMs < 0 {
		return inputError("duration_ms", "must be >= 0 (got "+itoa(durationMs)+")")
	}
	if !p.MeasuresDuration() {
		return nil
	}
	if nowMs <= 0 {
		return inputError("now_ms", "must be set (Unix milliseconds) for a policy with a retry budget or a circuit breaker")
	}
	p.mu.Lock()
	p.circuit.onDuration(nowMs, durationMs)
	p.mu.Unlock()
	return nil
}

// MeasuresDuration reports whether the policy counts calls' durations: a
// failure_rate breaker with slow_call_rate_threshold. Without it,
// RecordDuration does nothing, and a caller may skip measuring.
func (p *Policy) MeasuresDuration() bool { return p.circuit != nil && p.circuit.slow != nil }

// CircuitState returns the breaker's state at nowMs; BreakerClosed when the
// policy has no breaker.
func (p *Policy) CircuitState(nowMs int64) CircuitState {
	if p.circuit == nil {
		return BreakerClosed
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.circuit.expire(nowMs)
	return p.circuit.state(nowMs)
}

// elapsedPassed reports whether max elapsed, when set, has passed.
func (p *Policy) elapsedPassed(f *Failure) bool {
	return p.maxElapsedMs == 0 || f.ElapsedMs > p.maxElapsedMs
}

// outOfRange checks the numeric fields in a few branches, so it inlines;
// invalid builds the error only when something is wrong.
func (f *Failure) outOfRange() bool {
	return f.Attempt < 1 || (f.HTTPStatus != 0 && uint(f.HTTPStatus-100) > 499) ||
		uint(f.GRPCCode) > 16 || f.ElapsedMs|f.NowMs|f.PrevDelayMs < 0
}

func (f *Failure) invalid() error {
	switch {
	case f.Attempt < 1:
		return inputError("attempt", "must be >= 1 (got "+itoa(f.Attempt)+")")
	case f.HTTPStatus != 0 && (f.HTTPStatus < 100 || f.HTTPStatus > 599):
		return inputError("http_status", "must be 0 (none) or 100..599 (got "+itoa(f.HTTPStatus)+")")
	case f.GRPCCode < 0 || f.GRPCCode > 16:
		return inputError("grpc_code", "must be 0 (none) or 1..16 (got "+itoa(f.GRPCCode)+")")
	case f.ElapsedMs < 0:
		return inputError("elapsed_ms", "must be >= 0 (got "+itoa(f.ElapsedMs)+")")
	case f.NowMs < 0:
		return inputError("now_ms", "must be >= 0 (got "+itoa(f.NowMs)+")")
	}
	return inputError("prev_delay_ms", "must be >= 0 (got "+itoa(f.PrevDelayMs)+")")
}

// hint returns the server's requested wait in milliseconds, when present
// and sane. Retry-After wins over grpc-retry-pushback-ms.
func (p *Policy) hint(f *Failure) (int64, bool) {
	if !p.hintHonor {
		return 0, false
	}
	if f.RetryAfter != "" {
		return parseRetryAfter(f.RetryAfter, f.NowMs)
	}
	if f.RetryPushback != "" {
		return parsePushback(f.RetryPushback)
	}
	return 0, false
}

// mayRetryRequest is the idempotency gate: a request with a non-idempotent
// method and no idempotency key is retried only when the failure proves it
// never left (the connection was refused, the name never resolved).
func (p *Policy) mayRetryRequest(f *Failure) bool {
	if f.IdempotencyKey != "" {
		return true
	}
	for _, m := range p.idempotentMethods {
		if equalFoldASCII(m, f.Method) {
			return true
		}
	}
	return f.ErrorKind != "" && p.neverSent[f.ErrorKind]
}

func equalFoldASCII(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'a' <= x && x <= 'z' {
			x -= 'a' - 'A'
		}
		if 'a' <= y && y <= 'z' {
			y -= 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}
