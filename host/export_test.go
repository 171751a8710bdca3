package host

import (
	"context"
	"os"
	"testing"
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
