// Package host runs backstop.wasm, the retry policy core, in Go services
// through wazero. It is a thin adapter: the module parses, validates and
// decides everything, exactly as it does under the Node.js and Python hosts.
//
//	rt, err := host.New(ctx)
//	...
//	defer rt.Close(ctx)
//	p, err := rt.Preset(ctx, "default")
//	d, err := p.Decide(ctx, policy.Failure{Attempt: 1, HTTPStatus: 503, Random: rand.Float64()})
//
// # Instances
//
// A Go wasm instance is single-threaded and holds a Go heap of a few MiB,
// so a Runtime keeps a bounded pool of instances (WithPoolSize, default
// GOMAXPROCS), created on demand. A stateless policy (no retry budget, no
// circuit breaker) is loaded lazily into whichever instance serves a call,
// so calls run in parallel. A stateful policy lives in exactly one instance,
// chosen round-robin when it is loaded, so its budget and breaker see every
// decision in order, whichever goroutine makes it.
//
// A trap (a bug, or an instance out of memory) retires only its instance:
// stateless policies go on in the others or in a fresh one, and a stateful
// policy that lived there returns ErrStateLost (wasm/ABI.md, "When an
// instance traps").
package host

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/backstop-dev/backstop/internal/abi"
	"github.com/backstop-dev/backstop/policy"
)

// Runtime is a compiled backstop.wasm with its pool of instances. It is
// safe for concurrent use. Close it to release the instances.
type Runtime struct {
	rt     wazero.Runtime
	cm     wazero.CompiledModule
	modCfg wazero.ModuleConfig
	cache  wazero.CompilationCache // nil without WithCompilationCache
	closed atomic.Bool
	nextID atomic.Uint64

	size int                         // most instances
	list atomic.Pointer[[]*instance] // live instances, copied on write under mu
	mu   sync.Mutex                  // serialises changes to list, and pin
	pin  int                         // round-robin cursor for stateful policies
}

// New compiles the module (the embedded backstop.wasm unless WithModule)
// and starts its first instance.
//
// The module gets no capability: no files, no environment, no arguments,
// no network. Only the Go runtime inside it reads a clock or a random
// source (decisions take time and randomness as inputs): it gets the
// virtual clock of wasm/ABI.md, never the host's, and wazero's
// deterministic random source.
//
// # Errors
//
// New fails when an option is invalid, the module does not compile, or its
// abi_version is not the one this package implements.
func New(ctx context.Context, opts ...Option) (*Runtime, error) {
	cfg := defaults()
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := &Runtime{size: cfg.poolSize}
	r.list.Store(new([]*instance))
	rc := wazero.NewRuntimeConfig()
	if cfg.cacheDir != "" {
		cache, err := wazero.NewCompilationCacheWithDir(cfg.cacheDir)
		if err != nil {
			return nil, fmt.Errorf("backstop: compilation cache: %w", err)
		}
		r.cache = cache
		rc = rc.WithCompilationCache(cache)
	}
	if cfg.memoryLimitPages > 0 {
		rc = rc.WithMemoryLimitPages(cfg.memoryLimitPages)
	}
	r.rt = wazero.NewRuntimeWithConfig(ctx, rc)
	err := r.start(ctx, cfg)
	if err != nil {
		r.Close(ctx)
		return nil, err
	}
	return r, nil
}

func (r *Runtime) start(ctx context.Context, cfg config) error {
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, r.rt); err != nil {
		return fmt.Errorf("backstop: wasi: %w", err)
	}
	cm, err := r.rt.CompileModule(ctx, cfg.wasm)
	if err != nil {
		return fmt.Errorf("backstop.wasm: compile: %w", err)
	}
	r.cm = cm
	r.modCfg = wazero.NewModuleConfig().WithName("").WithStartFunctions("_initialize").
		WithStdout(cfg.output).WithStderr(cfg.output)
	// The first instance checks abi_version before anything else, so a
	// module of another version is refused with that reason.
	in, err := r.grow(ctx)
	if err != nil {
		return err
	}
	in.mu.Unlock()
	return nil
}

// checkExports verifies the signatures of every export of ABI version 1.
func checkExports(cm wazero.CompiledModule) error {
	defs := cm.ExportedFunctions()
	for name, sig := range exports {
		d, ok := defs[name]
		if !ok {
			return fmt.Errorf("backstop.wasm: %s is not exported", name)
		}
		if !slices.Equal(d.ParamTypes(), sig[0]) || !slices.Equal(d.ResultTypes(), sig[1]) {
			return fmt.Errorf("backstop.wasm: %s has the wrong signature", name)
		}
	}
	return nil
}

// Close releases every instance and the compilation cache handle. Policies
// of a closed Runtime return ErrClosed.
func (r *Runtime) Close(ctx context.Context) error {
	if r.closed.Swap(true) {
		return nil
	}
	err := r.rt.Close(ctx)
	if r.cache != nil {
		err = errors.Join(err, r.cache.Close(ctx))
	}
	return err
}

// Load loads a policy from policy file contents (JSON or YAML) or a preset
// name, as the module's policy_load does.
//
// # Errors
//
// A policy the module refuses gives a *PolicyError whose message names the
// field.
func (r *Runtime) Load(ctx context.Context, presetOrPolicy []byte) (*Policy, error) {
	return r.load(ctx, slices.Clone(capPolicy(presetOrPolicy)), false)
}

// capPolicy cuts data one byte past policy.MaxFileBytes: the module refuses
// anything longer with a *PolicyError, and that byte is all it needs to say
// so, whatever the size.
func capPolicy(data []byte) []byte {
	return data[:min(len(data), policy.MaxFileBytes+1)]
}

// LoadFile reads a policy file (JSON or YAML) and loads it as Load does.
func (r *Runtime) LoadFile(ctx context.Context, path string) (*Policy, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("backstop: %w", err)
	}
	data, err := io.ReadAll(io.LimitReader(f, policy.MaxFileBytes+1))
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("backstop: %w", err)
	}
	p, err := r.load(ctx, data, false)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

// Preset loads a named preset ("default", "critical", "batch",
// "fast-transient"; see policy.PresetNames). An unknown name gives a
// *PolicyError that lists the presets.
func (r *Runtime) Preset(ctx context.Context, name string) (*Policy, error) {
	return r.load(ctx, []byte(name), true)
}

// load validates the policy in a pooled instance and learns whether it is
// stateful. A stateless policy keeps that handle; a stateful one moves to
// its round-robin instance for good.
func (r *Runtime) load(ctx context.Context, data []byte, preset bool) (*Policy, error) {
	p := &Policy{rt: r, id: r.nextID.Add(1), data: data, preset: preset}
	in, err := r.get(ctx)
	if err != nil {
		return nil, err
	}
	h, err := in.load(ctx, data, preset)
	if err == nil {
		var st int32
		if st, err = in.handleCall(ctx, in.policyStateful, api.EncodeI32(h)); err == nil {
			p.stateful = st == 1
			in.handles[p.id] = h
		}
		if err == nil {
			// on_open never changes: read once, so OnOpen needs no call.
			var oo int32
			if oo, err = in.handleCall(ctx, in.policyOnOpen, api.EncodeI32(h)); err == nil {
				p.onOpen = policy.OnOpenDefer
				if oo == abi.OnOpenDeadLetter {
					p.onOpen = policy.OnOpenDeadLetter
				}
			}
		}
		if err == nil {
			// A policy bounds attempts from the start (elapsed 0) or never:
			// AttemptTimeout needs no call for one that never does.
			var w uint64
			if w, err = in.call(ctx, in.attemptTimeout, api.EncodeI32(h), 0); err == nil {
				p.boundsAttempts = int64(w) != 0
			}
		}
		if err == nil {
			// connect_timeout never changes either: read once.
			var w uint64
			if w, err = in.call(ctx, in.connectTimeout, api.EncodeI32(h)); err == nil {
				if p.connectMs = int64(w); p.connectMs < 0 {
					err = in.codeErr(ctx, "connect_timeout", p.connectMs)
				}
			}
		}
	}
	r.release(in)
	if err != nil {
		return nil, err
	}
	// A Policy dropped without Close frees its handles when collected, as
	// the Node.js and Python hosts do: else each one would hold a slot of
	// the module's handle table, and its memory, for good.
	p.cleanup = runtime.AddCleanup(p, r.forget, p.id)
	if !p.stateful {
		return p, nil
	}
	pin, err := r.pinTarget(ctx)
	if err != nil {
		p.Close(ctx)
		return nil, err
	}
	p.pinned.Store(pin)
	if pin != in {
		// Drop the validation copy; the pinned instance loads its own.
		in.mu.Lock()
		in.free(ctx, p.id)
		r.release(in)
	}
	return p, nil
}

// forget frees the handles of policy id, collected without Close, in every
// instance, as Close does.
func (r *Runtime) forget(id uint64) {
	if r.closed.Load() {
		return
	}
	for _, in := range r.instances() {
		in.mu.Lock()
		in.free(context.Background(), id)
		in.mu.Unlock()
	}
}

// get locks an instance for a stateless call: the first free one (so a
// lightly loaded Runtime keeps using the same warm instances), else a new
// one while the pool is below its size, else a busy one, waited for. The
// wait is for the call in progress on that instance, so it does not watch
// ctx.
func (r *Runtime) get(ctx context.Context) (*instance, error) {
	if r.closed.Load() {
		return nil, ErrClosed
	}
	for _, in := range *r.list.Load() {
		if in.mu.TryLock() {
			return in, nil
		}
	}
	if in, err := r.grow(ctx); in != nil || err != nil {
		return in, err
	}
	list := *r.list.Load()
	in := list[rand.IntN(len(list))]
	in.mu.Lock()
	return in, nil
}

// release unlocks an instance. A dead one leaves the pool; get creates a
// fresh one in its place when needed.
func (r *Runtime) release(in *instance) {
	dead := in.dead
	in.mu.Unlock()
	if dead == nil {
		return
	}
	r.mu.Lock()
	list := slices.DeleteFunc(slices.Clone(*r.list.Load()), func(x *instance) bool { return x == in })
	r.list.Store(&list)
	r.mu.Unlock()
	in.mod.Close(context.Background())
}

// grow creates an instance, locked, if the pool has room; else it returns
// nil, nil.
func (r *Runtime) grow(ctx context.Context) (*instance, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed.Load() {
		return nil, ErrClosed
	}
	list := *r.list.Load()
	if len(list) >= r.size {
		return nil, nil
	}
	in, err := newInstance(ctx, r.rt, r.cm, r.modCfg)
	if err != nil {
		return nil, err
	}
	in.mu.Lock()
	list = append(slices.Clone(list), in)
	r.list.Store(&list)
	return in, nil
}

// pinTarget picks the instance of a new stateful policy: round-robin over
// the pool, creating instances up to its size, so stateful policies spread
// out instead of queueing on one instance.
func (r *Runtime) pinTarget(ctx context.Context) (*instance, error) {
	r.mu.Lock()
	k := r.pin % r.size
	r.pin++
	r.mu.Unlock()
	if list := *r.list.Load(); k < len(list) {
		return list[k], nil
	}
	in, err := r.grow(ctx)
	if err != nil {
		return nil, err
	}
	if in == nil { // the pool filled up meanwhile
		list := *r.list.Load()
		return list[k%len(list)], nil
	}
	in.mu.Unlock()
	return in, nil
}

// instances returns the live instances.
func (r *Runtime) instances() []*instance { return *r.list.Load() }
