package host

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"sync"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/backstop-dev/backstop/internal/abi"
	"github.com/backstop-dev/backstop/policy"
)

const (
	// batchBytes bounds one decide_batch call (records, strings, results):
	// about 3,600 plain records, enough to make the call overhead vanish
	// while keeping each instance's buffer small.
	batchBytes = 256 << 10
)

// exports are the functions of the ABI (contract/abi.json, generated into
// abi.Exports) with their signatures, checked once when a Runtime starts
// so a wrong module fails early and clearly.
var exports = func() map[string][2][]api.ValueType {
	types := map[string]api.ValueType{"i32": i32, "i64": i64, "f64": f64}
	m := map[string][2][]api.ValueType{}
	for _, e := range abi.Exports {
		var params []api.ValueType
		for _, p := range e.Params {
			params = append(params, types[p])
		}
		m[e.Name] = [2][]api.ValueType{params, {types[e.Result]}}
	}
	return m
}()

const (
	i32 = api.ValueTypeI32
	i64 = api.ValueTypeI64
	f64 = api.ValueTypeF64
)

// instance is one module instance. The module is single-threaded, so every
// call holds mu. handles maps a Policy's id to its handle in this instance.
type instance struct {
	mu      sync.Mutex
	mod     api.Module
	mem     api.Memory
	handles map[uint64]int32
	dead    error // set when a call trapped: the instance is unusable
	clock   clock // the module's virtual time

	// stack is reused by every call (CallWithStack), so a call allocates
	// nothing; 15 is outcome's parameter count, the most of any export.
	stack [15]uint64

	bufAddr, bufLen uint32  // the shared buffer, cached until it must grow
	scratch         []int64 // batch result words, reused

	abiVersion, buffer, policyLoad, policyPreset, policyFree, policyStateful,
	decide, decideBatch, recordSuccess, recordDuration, circuitState, errorMessage,
	acquire, policyOnOpen, policyLints, budgetTokens, attemptTimeout, connectTimeout, outcome api.Function
}

// newInstance instantiates the compiled module and starts its Go runtime
// (_initialize: the module is a WASI reactor). The name is empty so that
// many instances of one module can live in a Runtime.
func newInstance(ctx context.Context, rt wazero.Runtime, cm wazero.CompiledModule, cfg wazero.ModuleConfig) (*instance, error) {
	in := &instance{handles: map[uint64]int32{}}
	mod, err := rt.InstantiateModule(ctx, cm, in.clock.config(cfg))
	if err != nil {
		return nil, fmt.Errorf("backstop.wasm: instantiate: %w", err)
	}
	in.mod, in.mem = mod, mod.Memory()
	in.abiVersion = mod.ExportedFunction("abi_version")
	if in.abiVersion == nil {
		mod.Close(ctx)
		return nil, fmt.Errorf("backstop.wasm: abi_version is not exported: not a backstop module")
	}
	v, err := in.call(ctx, in.abiVersion)
	if err != nil {
		mod.Close(ctx)
		return nil, err
	}
	if v != abi.Version {
		mod.Close(ctx)
		return nil, fmt.Errorf("backstop.wasm ABI version %d is not supported by this host (want %d)", int32(v), abi.Version)
	}
	if err := checkExports(cm); err != nil {
		mod.Close(ctx)
		return nil, err
	}
	for name, fn := range map[string]*api.Function{
		"buffer": &in.buffer, "policy_load": &in.policyLoad, "policy_preset": &in.policyPreset,
		"policy_free": &in.policyFree, "policy_stateful": &in.policyStateful, "decide": &in.decide,
		"decide_batch": &in.decideBatch, "record_success": &in.recordSuccess, "record_duration": &in.recordDuration,
		"circuit_state": &in.circuitState, "error_message": &in.errorMessage,
		"acquire": &in.acquire, "policy_on_open": &in.policyOnOpen, "policy_lints": &in.policyLints, "budget_tokens": &in.budgetTokens,
		"attempt_timeout": &in.attemptTimeout, "connect_timeout": &in.connectTimeout, "outcome": &in.outcome,
	} {
		*fn = mod.ExportedFunction(name)
	}
	if in.mem == nil {
		mod.Close(ctx)
		return nil, fmt.Errorf("backstop.wasm: memory is not exported")
	}
	if err := in.grow(ctx, 0); err != nil {
		mod.Close(ctx)
		return nil, err
	}
	return in, nil
}

// call runs fn with params and returns its first result (0 if none). A trap
// marks the instance dead: after a Go runtime crash its state is undefined.
func (in *instance) call(ctx context.Context, fn api.Function, params ...uint64) (uint64, error) {
	if in.dead != nil {
		return 0, in.dead
	}
	s := in.stack[:]
	copy(s, params)
	in.clock.tick()
	if err := fn.CallWithStack(ctx, s); err != nil {
		in.dead = fmt.Errorf("backstop.wasm: %s: %w", exportName(fn), err)
		return 0, in.dead
	}
	return s[0], nil
}

// exportName names fn in errors (the module has no name section).
func exportName(fn api.Function) string {
	if names := fn.Definition().ExportNames(); len(names) > 0 {
		return names[0]
	}
	return "?"
}

// message returns the module's last error message.
func (in *instance) message(ctx context.Context) string {
	w, err := in.call(ctx, in.errorMessage)
	if err != nil {
		return err.Error()
	}
	b, ok := in.mem.Read(uint32(w>>32), uint32(w))
	if !ok {
		return "(error message out of bounds)"
	}
	return string(b)
}

// codeErr turns a negative result of op into an error.
func (in *instance) codeErr(ctx context.Context, op string, code int64) error {
	msg := in.message(ctx)
	switch code {
	case abi.ErrPolicy:
		return &PolicyError{Message: msg}
	case abi.ErrInput:
		return &InputError{Index: -1, Message: msg}
	}
	return &codeError{op: op, code: code, msg: msg}
}

// grow makes the shared buffer at least n bytes long. The address changes
// only when the buffer grows, so it is cached.
func (in *instance) grow(ctx context.Context, n int) error {
	if uint32(n) <= in.bufLen && in.bufLen > 0 {
		return nil
	}
	if n > abi.MaxBuffer {
		return fmt.Errorf("backstop.wasm: %d bytes do not fit the module's %d MiB buffer", n, abi.MaxBuffer>>20)
	}
	v, err := in.call(ctx, in.buffer, api.EncodeI32(int32(n)))
	if err != nil {
		return err
	}
	if a := int32(v); a < 0 {
		return in.codeErr(ctx, "buffer", int64(a))
	}
	in.bufAddr, in.bufLen = uint32(v), uint32(max(n, 4096))
	return nil
}

// load loads policy bytes (or a preset name, when preset is set) and
// returns the new handle.
func (in *instance) load(ctx context.Context, data []byte, preset bool) (int32, error) {
	if err := in.grow(ctx, len(data)); err != nil {
		return 0, err
	}
	if !in.mem.Write(in.bufAddr, data) {
		return 0, fmt.Errorf("backstop.wasm: buffer out of memory bounds")
	}
	fn, op := in.policyLoad, "policy_load"
	if preset {
		fn, op = in.policyPreset, "policy_preset"
	}
	v, err := in.call(ctx, fn, api.EncodeI32(int32(len(data))))
	if err != nil {
		return 0, err
	}
	if h := int32(v); h < 0 {
		return 0, in.codeErr(ctx, op, int64(h))
	}
	return int32(v), nil
}

// handleCall calls a (h, ...) -> i32 export and checks its result.
func (in *instance) handleCall(ctx context.Context, fn api.Function, params ...uint64) (int32, error) {
	v, err := in.call(ctx, fn, params...)
	if err != nil {
		return 0, err
	}
	if r := int32(v); r < 0 {
		return 0, in.codeErr(ctx, exportName(fn), int64(r))
	}
	return int32(v), nil
}

// free frees the handle of policy id, if this instance loaded it. Errors
// are ignored: -1 cannot happen, and a dead instance is dropped anyway.
func (in *instance) free(ctx context.Context, id uint64) {
	if h, ok := in.handles[id]; ok {
		delete(in.handles, id)
		in.call(ctx, in.policyFree, api.EncodeI32(h))
	}
}

// words returns the reused result slice, n long.
func (in *instance) words(n int) []int64 {
	if cap(in.scratch) < n {
		in.scratch = make([]int64, n)
	}
	return in.scratch[:n]
}

// hint picks the ABI's one hint string: Retry-After wins, as in the policy.
func hint(f *policy.Failure) (string, uint32) {
	flags := abi.BoolFlags(f)
	if f.IdempotencyKey != "" {
		flags |= abi.FlagIdempotencyKey
	}
	if f.RetryAfter == "" && f.RetryPushback != "" {
		return f.RetryPushback, flags | abi.FlagPushback
	}
	return f.RetryAfter, flags
}

// sat32 saturates an int into an i32, so an out-of-range status or code
// stays out of range (and is refused by the module) instead of wrapping
// into a valid one.
func sat32(v int) int32 {
	return int32(min(max(v, math.MinInt32), math.MaxInt32))
}

// decideOne is the hot path: strings go to the buffer only when present,
// everything else travels as scalars on the reused stack.
func (in *instance) decideOne(ctx context.Context, h int32, f *policy.Failure) (int64, error) {
	if in.dead != nil {
		return 0, in.dead
	}
	s := in.stack[:12]
	if err := in.failureArgs(ctx, s[1:], f); err != nil {
		return 0, err
	}
	s[0] = api.EncodeI32(h) // after failureArgs: growing the buffer is a call on the same stack
	return in.callStack(ctx, in.decide, s)
}

// outcomeOne asks the outcome of job event e: the failure's fields as
// decide's (only for a failure: the module reads them for nothing else),
// now_ms for every event, then the delivery count and its limit.
func (in *instance) outcomeOne(ctx context.Context, h int32, e *policy.JobEvent) (int64, error) {
	if in.dead != nil {
		return 0, in.dead
	}
	s := in.stack[:15]
	if e.Event == policy.EventFailure {
		if err := in.failureArgs(ctx, s[2:13], &e.Failure); err != nil {
			return 0, err
		}
	} else {
		clear(s[2:13])
		s[6] = api.EncodeI64(e.Failure.NowMs)
	}
	// After failureArgs: growing the buffer is a call on the same stack.
	s[0], s[1] = api.EncodeI32(h), api.EncodeI32(int32(e.Event))
	s[13], s[14] = api.EncodeI64(e.Deliveries), api.EncodeI64(e.MaxDeliveries)
	return in.callStack(ctx, in.outcome, s)
}

// failureArgs writes f's strings to the buffer (only when present) and its
// fields to s (11 values, decide's after the handle). Growing the buffer
// calls the module on in.stack: the caller fills the rest of the stack
// after this returns.
func (in *instance) failureArgs(ctx context.Context, s []uint64, f *policy.Failure) error {
	hs, flags := hint(f)
	ml, kl, hl := len(f.Method), len(f.ErrorKind), len(hs)
	if n := ml + kl + hl; n > 0 {
		if err := in.grow(ctx, n); err != nil {
			return err
		}
		in.mem.WriteString(in.bufAddr, f.Method)
		in.mem.WriteString(in.bufAddr+uint32(ml), f.ErrorKind)
		in.mem.WriteString(in.bufAddr+uint32(ml+kl), hs)
	}
	_ = s[10] // one bounds check
	s[0] = api.EncodeI64(f.Attempt)
	s[1] = api.EncodeI32(sat32(f.HTTPStatus))
	s[2] = api.EncodeI32(sat32(f.GRPCCode))
	s[3] = api.EncodeI64(f.ElapsedMs)
	s[4] = api.EncodeI64(f.NowMs)
	s[5] = api.EncodeF64(f.Random)
	s[6] = api.EncodeI64(f.PrevDelayMs)
	s[7] = api.EncodeU32(flags)
	s[8] = api.EncodeI32(int32(ml))
	s[9] = api.EncodeI32(int32(kl))
	s[10] = api.EncodeI32(int32(hl))
	return nil
}

// callStack calls fn on the stack s already filled and returns its i64
// result; a trap marks the instance dead, as in call.
func (in *instance) callStack(ctx context.Context, fn api.Function, s []uint64) (int64, error) {
	in.clock.tick()
	if err := fn.CallWithStack(ctx, s); err != nil {
		in.dead = fmt.Errorf("backstop.wasm: %s: %w", exportName(fn), err)
		return 0, in.dead
	}
	return int64(s[0]), nil
}

// batchFits reports whether f can go in a decide_batch record: its strings
// must fit the record's u16 lengths. Others are decided one by one.
func batchFits(f *policy.Failure) bool {
	hs, _ := hint(f)
	return len(f.Method) <= abi.MaxString && len(f.ErrorKind) <= abi.MaxString && len(hs) <= abi.MaxString
}

// decideChunk decides fs (all batchFits) in one decide_batch call and
// writes the result words to res. The buffer holds the records at 0, then
// their strings, then the results (8-aligned).
func (in *instance) decideChunk(ctx context.Context, h int32, fs []policy.Failure, res []int64) error {
	strOff := len(fs) * abi.RecordSize
	strLen := 0
	for i := range fs {
		hs, _ := hint(&fs[i])
		strLen += len(fs[i].Method) + len(fs[i].ErrorKind) + len(hs)
	}
	outOff := (strOff + strLen + 7) &^ 7
	if err := in.grow(ctx, outOff+len(fs)*abi.ResultSize); err != nil {
		return err
	}
	// A view of guest memory stays valid until the guest runs again.
	view, ok := in.mem.Read(in.bufAddr, uint32(outOff))
	if !ok {
		return fmt.Errorf("backstop.wasm: buffer out of memory bounds")
	}
	s := strOff
	for i := range fs {
		f := &fs[i]
		hs, flags := hint(f)
		rec := abi.Record{
			Attempt: f.Attempt, ElapsedMs: f.ElapsedMs, NowMs: f.NowMs,
			Random: f.Random, PrevDelayMs: f.PrevDelayMs,
			HTTPStatus: sat32(f.HTTPStatus), GRPCCode: sat32(f.GRPCCode),
			Flags: flags, StrOff: uint32(s),
			MethodLen: uint16(len(f.Method)), KindLen: uint16(len(f.ErrorKind)), HintLen: uint16(len(hs)),
		}
		rec.Put(view[i*abi.RecordSize:])
		s += copy(view[s:], f.Method)
		s += copy(view[s:], f.ErrorKind)
		s += copy(view[s:], hs)
	}
	if _, err := in.handleCall(ctx, in.decideBatch, api.EncodeI32(h), 0,
		api.EncodeI32(int32(len(fs))), api.EncodeI32(int32(outOff))); err != nil {
		return err
	}
	out, ok := in.mem.Read(in.bufAddr+uint32(outOff), uint32(len(fs)*abi.ResultSize))
	if !ok {
		return fmt.Errorf("backstop.wasm: buffer out of memory bounds")
	}
	for i := range res {
		res[i] = int64(binary.LittleEndian.Uint64(out[i*abi.ResultSize:]))
	}
	return nil
}
