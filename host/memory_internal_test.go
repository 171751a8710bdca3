package host

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/backstop-dev/backstop/internal/abi"
	"github.com/backstop-dev/backstop/policy"
)

// Growing the shared buffer in 64 KiB steps up to its 64 MiB maximum never
// traps and leaves the module's memory at about twice the maximum; beyond
// it, buffer returns -4 (ERR_MEMORY) with a message. It used to trap at
// about 28 MiB, every step's old buffer left to a GC that had stopped.
func TestBufferGrowthIsBounded(t *testing.T) {
	ctx := context.Background()
	rt, err := New(ctx, SharedCache(), WithPoolSize(1))
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	in := rt.instances()[0]
	in.mu.Lock()
	defer in.mu.Unlock()
	for n := 64 << 10; n <= abi.MaxBuffer; n += 64 << 10 {
		if err := in.grow(ctx, n); err != nil {
			t.Fatalf("growing the buffer to %d bytes: %v", n, err)
		}
	}
	const bound = 3 * abi.MaxBuffer / (64 << 10) // pages
	if pages := in.mem.Size() / (64 << 10); pages > bound {
		t.Errorf("a %d MiB buffer takes %d pages of memory, want <= %d", abi.MaxBuffer>>20, pages, bound)
	}
	v, err := in.call(ctx, in.buffer, api.EncodeI32(abi.MaxBuffer+1))
	if err != nil {
		t.Fatal(err)
	}
	if code := int32(v); code != abi.ErrMemory || !strings.Contains(in.message(ctx), "size must be in 0..67108864") {
		t.Errorf("buffer(64 MiB + 1) = %d %q, want -4 naming the maximum", code, in.message(ctx))
	}
	if err := in.grow(ctx, abi.MaxBuffer+1); err == nil || !strings.Contains(err.Error(), "64 MiB") {
		t.Errorf("the host grew the buffer past 64 MiB: %v", err)
	}
}

// The module's clocks are virtual (wasm/ABI.md, "Clocks"): the same calls
// give the same time, whatever the host's clock says, and time moves about
// 1 ms per call, the readings during a call adding nanoseconds.
func TestClockIsVirtual(t *testing.T) {
	ctx := context.Background()
	run := func() int64 {
		rt, err := New(ctx, SharedCache(), WithPoolSize(1))
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Close(ctx)
		for range 50 {
			p, err := rt.Load(ctx, []byte(`{"max_attempts": 3, "classify": {"http": {"418": "retryable"}}}`))
			if err != nil {
				t.Fatal(err)
			}
			p.Decide(ctx, policy.Failure{Attempt: 1, HTTPStatus: 418})
			p.Close(ctx)
		}
		in := rt.instances()[0]
		in.mu.Lock()
		defer in.mu.Unlock()
		return in.clock.ns
	}
	a, b := run(), run()
	if a != b {
		t.Errorf("the same calls gave different times: %d ns, then %d ns", a, b)
	}
	// 50 × (load, stateful, on_open, attempt_timeout, connect_timeout,
	// decide, free) calls, plus start-up.
	if calls := a / clockCall; calls < 350 || calls > 370 || a%clockCall > 100_000 {
		t.Errorf("virtual time %d ns: want about 1 ms per call and a few ns per reading", a)
	}
}

// A Policy dropped without Close frees its handles once collected, as in
// the Node.js and Python hosts: it used to hold a slot of the handle table,
// and its memory in the module, for good.
func TestUnclosedPoliciesAreFreed(t *testing.T) {
	ctx := context.Background()
	rt, err := New(ctx, SharedCache(), WithPoolSize(1))
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	in := rt.instances()[0]
	held := func() int {
		in.mu.Lock()
		defer in.mu.Unlock()
		return len(in.handles)
	}
	// Reachable until counted: a collection may run during the loop.
	ps := make([]*Policy, 0, 100)
	for range 100 {
		p, err := rt.Load(ctx, []byte(`{"max_attempts": 3}`))
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	if n := held(); n != 100 {
		t.Fatalf("%d handles held, want 100", n)
	}
	runtime.KeepAlive(ps) // and unreachable from here on
	// Cleanups run on their own goroutine after a collection.
	for i := 0; i < 1000 && held() > 0; i++ {
		runtime.GC()
		runtime.Gosched()
	}
	if n := held(); n != 0 {
		t.Errorf("%d handles of collected policies are still held", n)
	}
}

// The module keeps its heap bounded by itself under a host that does not
// give it virtual time: here a fake clock of 10 ms per reading (wazero's
// default fake clock, 1 ms per reading, does the same, only ten times
// later: the GC used to stop for good from about the 1,100th load and, as
// the module changed, later still). Without settleGC in wasm/main.go the
// module passes the bound (wasm/ABI.md, "Clocks").
func TestModuleBoundsItsHeapOnFakeClocks(t *testing.T) {
	ctx := context.Background()
	cache, err := wazero.NewCompilationCacheWithDir(sharedCache)
	if err != nil {
		t.Fatal(err)
	}
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfig().WithCompilationCache(cache))
	defer rt.Close(ctx)
	wasi_snapshot_preview1.MustInstantiate(ctx, rt)
	var now int64
	tick := func() int64 { now += 10_000_000; return now }
	mod, err := rt.InstantiateWithConfig(ctx, backstopWasm, wazero.NewModuleConfig().
		WithStartFunctions("_initialize").WithNanotime(tick, 1))
	if err != nil {
		t.Fatal(err)
	}
	var table []string // a policy of about 3.9 KB
	for code := 100; len(table) < 190; code++ {
		table = append(table, `"`+strconv.Itoa(code)+`": "permanent"`)
	}
	data := []byte(`{"max_attempts": 8, "classify": {"http": {` + strings.Join(table, ", ") + `}}}`)
	r, err := mod.ExportedFunction("buffer").Call(ctx, api.EncodeI32(int32(len(data))))
	if err != nil {
		t.Fatal(err)
	}
	load, free := mod.ExportedFunction("policy_load"), mod.ExportedFunction("policy_free")
	const cycles, bound = 1500, 400 // pages
	for i := range cycles {
		mod.Memory().Write(uint32(r[0]), data)
		h, err := load.Call(ctx, api.EncodeI32(int32(len(data))))
		if err != nil {
			t.Fatalf("cycle %d: %v", i, err)
		}
		if int32(h[0]) < 0 {
			t.Fatalf("cycle %d: policy_load = %d", i, int32(h[0]))
		}
		free.Call(ctx, h[0])
	}
	if pages := mod.Memory().Size() / (64 << 10); pages > bound {
		t.Errorf("after %d load/free cycles on fake clocks the module has %d pages, want <= %d", cycles, pages, bound)
	}
}
