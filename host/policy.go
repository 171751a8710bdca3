package host

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/tetratelabs/wazero/api"

	"github.com/backstop-dev/backstop/internal/abi"
	"github.com/backstop-dev/backstop/policy"
)

// Policy is a policy loaded into a Runtime. It is safe for concurrent use.
// Each Policy has its own retry-budget and circuit-breaker state, even when
// two are loaded from the same bytes.
type Policy struct {
	rt       *Runtime
	id       uint64 // key of this policy's handle in each instance
	data     []byte // what instances load, lazily
	preset   bool   // data is a preset name for policy_preset
	stateful bool
	noSlow   atomic.Bool // record_duration answered 1: no slow-call rate, nothing to report
	onOpen   string      // policy.OnOpenDefer or policy.OnOpenDeadLetter
	lints    []policy.Lint
	// boundsAttempts: the policy has attempt_timeout or max_elapsed (stop_when any).
	boundsAttempts bool
	connectMs      int64                    // connect_timeout, read once: it never changes
	pinned         atomic.Pointer[instance] // the one instance holding a stateful policy's state
	closed         atomic.Bool
	cleanup        runtime.Cleanup // frees the handles if the Policy is collected without Close
}

// Stateful reports whether the policy has a retry budget or a circuit
// breaker. Calls on a stateful policy are serialised on one instance.
func (p *Policy) Stateful() bool { return p.stateful }

// Lints returns the policy's lints, as the module reported them when it
// loaded (docs/policy.md, "Lints"): warnings about a valid policy, which
// decides as written. The Runtime also logs each one at load, through
// WithLogger. Lints its lint_ignore names are left out; nil when none.
func (p *Policy) Lints() []policy.Lint { return slices.Clone(p.lints) }

// acquire locks the instance that serves a call and returns the policy's
// handle there, loading the policy into it on first use.
func (p *Policy) acquire(ctx context.Context) (*instance, int32, error) {
	if p.closed.Load() || p.rt.closed.Load() {
		return nil, 0, ErrClosed
	}
	var in *instance
	if p.stateful {
		var err error
		if in, err = p.lockPinned(ctx); err != nil {
			return nil, 0, err
		}
	} else {
		var err error
		if in, err = p.rt.get(ctx); err != nil {
			return nil, 0, err
		}
	}
	h, err := p.handle(ctx, in)
	if err != nil {
		p.rt.release(in)
		return nil, 0, err
	}
	return in, h, nil
}

// lockPinned locks the instance of a stateful policy. If that instance
// trapped (it left the pool then) after the policy was loaded into it, the
// budget and breaker state went with it: ErrStateLost, for good. If the
// policy had not reached it yet, nothing was lost, and it moves to another
// instance.
func (p *Policy) lockPinned(ctx context.Context) (*instance, error) {
	for {
		in := p.pinned.Load()
		in.mu.Lock()
		if in.dead == nil {
			return in, nil
		}
		_, had := in.handles[p.id]
		dead := in.dead
		in.mu.Unlock()
		if had {
			trap, _, _ := strings.Cut(dead.Error(), "\n") // not the wasm stack trace
			return nil, fmt.Errorf("%w (%s)", ErrStateLost, trap)
		}
		next, err := p.rt.pinTarget(ctx)
		if err != nil {
			return nil, err
		}
		p.pinned.CompareAndSwap(in, next)
	}
}

// handle returns the policy's handle in in (locked). Checking closed under
// the instance lock means Close, which frees handles under the same lock,
// never leaves one behind.
func (p *Policy) handle(ctx context.Context, in *instance) (int32, error) {
	if h, ok := in.handles[p.id]; ok {
		return h, nil
	}
	if p.closed.Load() {
		return 0, ErrClosed
	}
	h, err := in.load(ctx, p.data, p.preset)
	if err != nil {
		return 0, err
	}
	in.handles[p.id] = h
	return h, nil
}

// Decide returns the policy's decision for one failure. It allocates
// nothing; strings are copied into the module only when non-empty.
//
// # Errors
//
// An invalid field gives an *InputError naming it, and changes no state:
// an HTTPStatus or GRPCCode that does not fit in 32 bits, a Method,
// ErrorKind, RetryAfter or RetryPushback longer than 65535 bytes (checked
// by the host, in that order, as every host does), then what the module
// refuses (Attempt < 1, HTTPStatus not 0 or 100..599, GRPCCode not 0..16, a
// negative ElapsedMs, NowMs or PrevDelayMs). ErrClosed after Close.
func (p *Policy) Decide(ctx context.Context, f policy.Failure) (policy.Decision, error) {
	if err := check(&f); err != nil {
		if closed := p.checkOpen(); closed != nil {
			err = closed
		}
		return policy.Decision{}, err
	}
	in, h, err := p.acquire(ctx)
	if err != nil {
		return policy.Decision{}, err
	}
	w, err := in.decideOne(ctx, h, &f)
	if err == nil && w < 0 {
		err = in.codeErr(ctx, "decide", w)
	}
	p.rt.release(in)
	if err != nil {
		return policy.Decision{}, err
	}
	return abi.UnpackDecision(w), nil
}

// DecideBatch decides failures in order, as Decide would one by one, and
// appends one decision per failure to out. The failures go to the module
// in a few large calls, which is much faster than Decide in a loop. A
// stateful policy decides the whole batch without interleaving other
// calls.
//
// # Errors
//
// Like the module, DecideBatch goes on past an invalid failure, so a
// stateful policy counts exactly the valid ones. It then still returns
// len(failures) decisions, the zero Decision at each invalid index, with an
// *InputError whose Index names the first invalid failure. Any other error
// returns out unchanged.
func (p *Policy) DecideBatch(ctx context.Context, failures []policy.Failure, out []policy.Decision) ([]policy.Decision, error) {
	base := len(out)
	in, h, err := p.acquire(ctx)
	if err != nil {
		return out, err
	}
	defer p.rt.release(in)
	out = slices.Grow(out, len(failures))[:base+len(failures)]
	res := out[base:]
	var first error
	for i := 0; i < len(failures); {
		if err := ctx.Err(); err != nil {
			return out[:base], err
		}
		// A failure the host refuses is not sent: the module never sees
		// it, as in Decide.
		if err := check(&failures[i]); err != nil {
			res[i] = policy.Decision{}
			if first == nil {
				err.(*InputError).Index = i
				first = err
			}
			i++
			continue
		}
		// A chunk: as many valid failures as fit in batchBytes (a valid
		// failure's strings fit in a batch record).
		n, size := 0, 0
		for i+n < len(failures) && check(&failures[i+n]) == nil {
			f := &failures[i+n]
			hs, _ := hint(f)
			size += abi.RecordSize + abi.ResultSize + len(f.Method) + len(f.ErrorKind) + len(hs)
			if n > 0 && size > batchBytes {
				break
			}
			n++
		}
		words := in.words(n)
		if err := in.decideChunk(ctx, h, failures[i:i+n], words); err != nil {
			return out[:base], err
		}
		for k, w := range words {
			res[i+k] = policy.Decision{}
			if w >= 0 {
				res[i+k] = abi.UnpackDecision(w)
			} else if first == nil {
				first = p.batchErr(ctx, in, i+k, w)
			}
		}
		i += n
	}
	return out, first
}

// check returns the *InputError of a failure the host refuses before the
// module sees it: a status or code that does not fit the ABI's i32, or a
// string longer than a batch record holds (the rule of every host, for
// Decide too). The order and the messages are those of every host
// (testdata/vectors/README.md).
func check(f *policy.Failure) error {
	var field, reason string
	switch {
	case f.HTTPStatus != int(int32(f.HTTPStatus)):
		field, reason = "http_status", "must be a 32-bit integer (got "+strconv.Itoa(f.HTTPStatus)+")"
	case f.GRPCCode != int(int32(f.GRPCCode)):
		field, reason = "grpc_code", "must be a 32-bit integer or a status name (got "+strconv.Itoa(f.GRPCCode)+")"
	case len(f.ErrorKind) > abi.MaxString:
		field, reason = "error_kind", tooLong(len(f.ErrorKind))
	case len(f.RetryAfter) > abi.MaxString:
		field, reason = "retry_after", tooLong(len(f.RetryAfter))
	case len(f.RetryPushback) > abi.MaxString:
		field, reason = "grpc_retry_pushback_ms", tooLong(len(f.RetryPushback))
	case len(f.Method) > abi.MaxString:
		field, reason = "method", tooLong(len(f.Method))
	default:
		return nil
	}
	return &InputError{Index: -1, Message: "invalid failure: " + field + ": " + reason}
}

func tooLong(n int) string {
	return "must be at most " + strconv.Itoa(abi.MaxString) + " bytes (got " + strconv.Itoa(n) + ")"
}

// batchErr builds the error of the first failed record of a batch. The
// module prefixes its message with the record's index within the call
// ("record 3: "), which is dropped for the index within the whole batch.
func (p *Policy) batchErr(ctx context.Context, in *instance, index int, code int64) error {
	err := in.codeErr(ctx, "decide_batch", code)
	if ie, ok := err.(*InputError); ok {
		if _, msg, ok := strings.Cut(ie.Message, ": "); ok && strings.HasPrefix(ie.Message, "record ") {
			ie.Message = msg
		}
		ie.Index = index
	}
	return err
}

// RecordSuccess reports a successful call at nowMs (Unix milliseconds) to
// the policy's retry budget and circuit breaker. It does nothing for a
// stateless policy.
func (p *Policy) RecordSuccess(ctx context.Context, nowMs int64) error {
	if !p.stateful {
		return p.checkOpen()
	}
	in, h, err := p.acquire(ctx)
	if err != nil {
		return err
	}
	defer p.rt.release(in)
	_, err = in.handleCall(ctx, in.recordSuccess, api.EncodeI32(h), api.EncodeI64(nowMs))
	return err
}

// RecordDuration reports how long a call that ended at nowMs (Unix
// milliseconds) took, durationMs, to the breaker's slow-call window; see
// policy.Policy.RecordDuration. Report each call once, success or
// failure, before its RecordSuccess or Decide. It does nothing for a
// stateless policy.
//
// # Errors
//
// An *InputError for durationMs < 0, or nowMs <= 0 on a policy with a
// slow-call rate; ErrStateLost when the instance holding the breaker
// trapped; ErrClosed after Close.
func (p *Policy) RecordDuration(ctx context.Context, nowMs, durationMs int64) error {
	if !p.stateful || p.noSlow.Load() {
		if durationMs < 0 {
			return &InputError{Index: -1, Message: "invalid failure: duration_ms: must be >= 0 (got " + strconv.FormatInt(durationMs, 10) + ")"}
		}
		return p.checkOpen()
	}
	in, h, err := p.acquire(ctx)
	if err != nil {
		return err
	}
	defer p.rt.release(in)
	r, err := in.handleCall(ctx, in.recordDuration, api.EncodeI32(h), api.EncodeI64(nowMs), api.EncodeI64(durationMs))
	if r == 1 {
		p.noSlow.Store(true) // no slow-call rate: the module counts nothing, now or later
	}
	return err
}

// Acquire asks permission for one call at nowMs (Unix milliseconds),
// before the call is made; see policy.Policy.Acquire for the breaker's
// rules. An allowed call in half-open is a trial: report its outcome with
// RecordSuccess, or Decide for a failure. A stateless policy always allows
// (without calling the module).
//
// # Errors
//
// An *InputError for nowMs < 0, or 0 on a stateful policy (the Go host
// takes the caller's clock as given, as Decide does); no state changes
// then. ErrStateLost when the instance holding the breaker trapped;
// ErrClosed after Close.
func (p *Policy) Acquire(ctx context.Context, nowMs int64) (policy.Permit, error) {
	if !p.stateful {
		if nowMs < 0 {
			return policy.Permit{}, &InputError{Index: -1, Message: "invalid failure: now_ms: must be >= 0 (got " + strconv.FormatInt(nowMs, 10) + ")"}
		}
		return policy.Permit{Allowed: true, State: policy.BreakerClosed}, p.checkOpen()
	}
	in, h, err := p.acquire(ctx)
	if err != nil {
		return policy.Permit{}, err
	}
	defer p.rt.release(in)
	w, err := in.call(ctx, in.acquire, api.EncodeI32(h), api.EncodeI64(nowMs))
	if err != nil {
		return policy.Permit{}, err
	}
	if int64(w) < 0 {
		return policy.Permit{}, in.codeErr(ctx, "acquire", int64(w))
	}
	return abi.UnpackPermit(int64(w)), nil
}

// BudgetTokens returns what is left of the policy's retry budget at nowMs
// (Unix milliseconds), in milli-units, without changing it; see
// policy.Policy.BudgetTokens. ok is false when the policy has no budget.
//
// # Errors
//
// An *InputError for nowMs < 0; ErrStateLost when the instance holding the
// budget trapped; ErrClosed after Close.
func (p *Policy) BudgetTokens(ctx context.Context, nowMs int64) (milli int64, ok bool, err error) {
	if !p.stateful {
		return 0, false, p.checkOpen()
	}
	in, h, err := p.acquire(ctx)
	if err != nil {
		return 0, false, err
	}
	defer p.rt.release(in)
	w, err := in.call(ctx, in.budgetTokens, api.EncodeI32(h), api.EncodeI64(nowMs))
	if err != nil {
		return 0, false, err
	}
	if int64(w) < 0 {
		return 0, false, in.codeErr(ctx, "budget_tokens", int64(w))
	}
	milli, ok = abi.UnpackBudget(int64(w))
	return milli, ok, nil
}

// AttemptTimeout returns how long, in ms, the attempt starting elapsedMs
// after the first may run: the policy's attempt_timeout, cut to what is
// left of max_elapsed; see policy.Policy.AttemptTimeout. 0 means no
// timeout.
//
// # Errors
//
// An *InputError for a negative elapsedMs; ErrClosed after Close.
func (p *Policy) AttemptTimeout(ctx context.Context, elapsedMs int64) (int64, error) {
	if !p.boundsAttempts && elapsedMs >= 0 {
		return 0, p.checkOpen()
	}
	in, h, err := p.acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer p.rt.release(in)
	w, err := in.call(ctx, in.attemptTimeout, api.EncodeI32(h), api.EncodeI64(elapsedMs))
	if err != nil {
		return 0, err
	}
	if int64(w) < 0 {
		return 0, in.codeErr(ctx, "attempt_timeout", int64(w))
	}
	return int64(w), nil
}

// Outcome returns what a worker does about a job event, decided by the
// module; see policy.Policy.Outcome for the rules. A stateless policy
// answers the before and success events without calling the module (as
// Acquire and RecordSuccess do).
//
// # Errors
//
// An invalid failure (EventFailure) returns the Outcome that dead-letters
// it (Malformed, Invalid set) with an *InputError naming the field, as
// Decide's; no state changes. An invalid event gives an *InputError
// ("invalid event: …") and no Outcome. ErrStateLost when the instance
// holding the budget and breaker trapped; ErrClosed after Close.
func (p *Policy) Outcome(ctx context.Context, e policy.JobEvent) (policy.Outcome, error) {
	switch {
	case e.Event == policy.EventFailure:
		if err := check(&e.Failure); err != nil {
			if closed := p.checkOpen(); closed != nil {
				return policy.Outcome{}, closed
			}
			return invalidOutcome, err
		}
	case !p.stateful && e.Failure.NowMs >= 0 && (e.Event == policy.EventBefore || e.Event == policy.EventSuccess):
		if err := p.checkOpen(); err != nil {
			return policy.Outcome{}, err
		}
		if e.Event == policy.EventBefore {
			return policy.Outcome{Action: policy.OutcomeRun}, nil
		}
		return policy.Outcome{Action: policy.OutcomeAck, Reason: policy.Success, Count: policy.CountSuccess}, nil
	}
	in, h, err := p.acquire(ctx)
	if err != nil {
		return policy.Outcome{}, err
	}
	defer p.rt.release(in)
	w, err := in.outcomeOne(ctx, h, &e)
	switch {
	case err != nil:
		return policy.Outcome{}, err
	case w < 0:
		return policy.Outcome{}, in.codeErr(ctx, "outcome", w)
	case abi.UnpackOutcome(w).Invalid:
		return abi.UnpackOutcome(w), &InputError{Index: -1, Message: in.message(ctx)}
	}
	return abi.UnpackOutcome(w), nil
}

// invalidOutcome dead-letters a failure refused as invalid input.
var invalidOutcome = policy.Outcome{Action: policy.OutcomeDeadLetter, Reason: policy.Malformed, Count: policy.CountDeadLetter, Invalid: true}

// ConnectTimeoutMs returns the policy's connect_timeout in ms (0: none,
// the client's own): how long establishing a connection may take within
// an attempt. retry.HTTPTransport and retry.Dialer apply it.
func (p *Policy) ConnectTimeoutMs() int64 { return p.connectMs }

// OnOpen returns what a queue does with a job refused by an open breaker
// or an empty budget: policy.OnOpenDefer (the default) or
// policy.OnOpenDeadLetter.
func (p *Policy) OnOpen() string { return p.onOpen }

// CircuitState returns the state of the policy's circuit breaker at nowMs:
// policy.BreakerClosed when it has none.
func (p *Policy) CircuitState(ctx context.Context, nowMs int64) (policy.CircuitState, error) {
	if !p.stateful {
		return policy.BreakerClosed, p.checkOpen()
	}
	in, h, err := p.acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer p.rt.release(in)
	s, err := in.handleCall(ctx, in.circuitState, api.EncodeI32(h), api.EncodeI64(nowMs))
	return policy.CircuitState(s), err
}

func (p *Policy) checkOpen() error {
	if p.closed.Load() || p.rt.closed.Load() {
		return ErrClosed
	}
	return nil
}

// Close frees the policy in every instance that loaded it. Later calls
// return ErrClosed. Closing the Runtime frees all its policies at once; a
// Policy collected without Close is freed then.
func (p *Policy) Close(ctx context.Context) error {
	if p.closed.Swap(true) || p.rt.closed.Load() {
		return nil
	}
	p.cleanup.Stop()
	for _, in := range p.rt.instances() {
		in.mu.Lock()
		in.free(ctx, p.id)
		in.mu.Unlock()
	}
	return nil
}
