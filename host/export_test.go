package host

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"

	"github.com/tetratelabs/wazero/api"

	"github.com/backstop-dev/backstop/internal/abi"
)

// sharedCache is a compilation cache directory for the whole test binary:
// the module then compiles once per run, which matters under -race, where
// compiling it takes about ten seconds.
var sharedCache string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "backstop-host-test")
	if err != nil {
		panic(err)
	}
	sharedCache = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// SharedCache is WithCompilationCache over the test binary's cache.
func SharedCache() Option { return WithCompilationCache(sharedCache) }

// MemorySize returns the linear memory size of the Runtime's largest
// instance, for the memory benchmark.
func MemorySize(r *Runtime) uint32 {
	var n uint32
	for _, in := range r.instances() {
		n = max(n, in.mem.Size())
	}
	return n
}

// WithMemoryLimit caps each instance's linear memory at pages of 64 KiB,
// so that a large buffer makes the module run out of memory and trap.
func WithMemoryLimit(pages uint32) Option {
	return func(c *config) { c.memoryLimitPages = pages }
}

// GrowBuffer asks one of the Runtime's instances for an input buffer of n
// bytes: with WithMemoryLimit, a real trap that costs nothing to cause
// (policies are cut at policy.MaxFileBytes, so Load no longer grows it).
func GrowBuffer(ctx context.Context, r *Runtime, n int) error {
	in, err := r.get(ctx)
	if err != nil {
		return err
	}
	defer r.release(in)
	return in.grow(ctx, n)
}

// CallValue writes value into the buffer of the instance serving p and
// calls decide_value (event < 0) or outcome_value (the event's number),
// telling the module the value is n bytes long: the raw word, and the
// module's message when the word is an error code or an invalid outcome.
// The exports are for hosts whose callers pass values of any type; Go's
// pass a policy.Failure, so only the tests call them.
func CallValue(ctx context.Context, p *Policy, event int32, value []byte, n int32, deliveries, maxDeliveries int64) (int64, string, error) {
	in, h, err := p.acquire(ctx)
	if err != nil {
		return 0, "", err
	}
	defer p.rt.release(in)
	return in.callValue(ctx, h, event, value, n, deliveries, maxDeliveries)
}

// CallValueHandle is CallValue with handle h (0: none) on one of r's
// instances.
func CallValueHandle(ctx context.Context, r *Runtime, h, event int32, value []byte) (int64, string, error) {
	in, err := r.get(ctx)
	if err != nil {
		return 0, "", err
	}
	defer r.release(in)
	return in.callValue(ctx, h, event, value, int32(len(value)), 0, 0)
}

// valueFuncs holds each instance's decide_value and outcome_value.
var valueFuncs sync.Map // *instance -> [2]api.Function

func (in *instance) callValue(ctx context.Context, h, event int32, value []byte, n int32, deliveries, maxDeliveries int64) (int64, string, error) {
	if err := in.grow(ctx, len(value)); err != nil {
		return 0, "", err
	}
	if !in.mem.Write(in.bufAddr, value) {
		return 0, "", errors.New("buffer out of memory bounds")
	}
	// ExportedFunction makes a new callable (a stack of its own) each
	// time: look each one up once per instance, as the typed exports are,
	// so the benchmarks measure the call.
	fns, _ := valueFuncs.Load(in)
	if fns == nil {
		fns, _ = valueFuncs.LoadOrStore(in, [2]api.Function{
			in.mod.ExportedFunction("decide_value"), in.mod.ExportedFunction("outcome_value")})
	}
	decideValue, outcomeValue := fns.([2]api.Function)[0], fns.([2]api.Function)[1]
	var v uint64
	var err error
	if event < 0 {
		v, err = in.call(ctx, decideValue, api.EncodeI32(h), api.EncodeI32(n))
	} else {
		v, err = in.call(ctx, outcomeValue, api.EncodeI32(h), api.EncodeI32(event),
			api.EncodeI32(n), api.EncodeI64(deliveries), api.EncodeI64(maxDeliveries))
	}
	if err != nil {
		return 0, "", err
	}
	w := int64(v)
	if w < 0 || (event >= 0 && abi.UnpackOutcome(w).Invalid) {
		return w, in.message(ctx), nil
	}
	return w, "", nil
}
