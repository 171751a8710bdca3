"""backstop.wasm under wasmtime: compile (cached on disk), instantiate, call.

This is the only module that touches wasmtime. It follows wasm/ABI.md.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import struct
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, NoReturn, Optional, Tuple

import wasmtime

from ._errors import BackstopError, InputError, PolicyError

#: The version of wasm/ABI.md this host implements.
ABI_VERSION = 1

# Error codes (ABI.md, "Error codes").
ERR_HANDLE, ERR_POLICY, ERR_INPUT = -1, -2, -3

# Every export of ABI version 1: parameter and result types as struct codes
# (i = i32, q = i64, d = f64). Checked when an instance starts, so a wrong
# module fails early and clearly.
_EXPORTS: Dict[str, Tuple[str, str]] = {
    "buffer": ("i", "i"),
    "policy_load": ("i", "i"),
    "policy_preset": ("i", "i"),
    "policy_free": ("i", "i"),
    "policy_stateful": ("i", "i"),
    "decide": ("iqiiqqdqiiii", "q"),
    "decide_batch": ("iiii", "i"),
    "record_success": ("iq", "i"),
    "circuit_state": ("iq", "i"),
    "error_message": ("", "q"),
}
_WASM_TYPES = {"i": "i32", "q": "i64", "d": "f64"}

_WASM_FILE = Path(__file__).with_name("backstop.wasm")


class Instance:
    """One instance of backstop.wasm with its own Store.

    A module instance is single-threaded: every call must hold ``lock``.
    """

    def __init__(self, wasm: Optional[bytes] = None, *, cache_dir: Any = "default", fast: bool = True) -> None:
        """Starts backstop.wasm (or wasm), caching its compiled form in
        cache_dir (None: no cache), and calling it through wasmtime's C API
        unless fast is false."""
        if wasm is None:
            wasm = _WASM_FILE.read_bytes()
        if cache_dir == "default":
            cache_dir = default_cache_dir()
        config = wasmtime.Config()
        # Memory never moves (it reserves its whole 4 GiB range instead), so
        # the address of the shared buffer stays valid across calls.
        config.memory_may_move = False
        engine = wasmtime.Engine(config)
        module = load_module(engine, wasm, cache_dir)
        # WASI granting nothing: no preopened directories, no environment,
        # no arguments, no inherited stdio. The Go runtime only reads the
        # clock and the random source to start.
        store = wasmtime.Store(engine)
        store.set_wasi(wasmtime.WasiConfig())
        linker = wasmtime.Linker(engine)
        linker.define_wasi()
        try:
            exports = linker.instantiate(store, module).exports(store)
            init = exports.get("_initialize")  # a WASI reactor starts its runtime here
            if isinstance(init, wasmtime.Func):
                init(store)
            version = _func(store, exports, "abi_version", "", "i")(store)
        except (wasmtime.WasmtimeError, wasmtime.Trap) as e:
            raise BackstopError("backstop.wasm: cannot start: %s" % e) from e
        self.lock = threading.Lock()
        self._store = store
        self._exports = exports  # keeps the Func objects alive for the fast path
        self._dead: Optional[BackstopError] = None
        if version != ABI_VERSION:
            raise BackstopError(
                "backstop.wasm ABI version %d is not supported by this host (want %d): "
                "install the backstop-policy release that matches the module" % (version, ABI_VERSION))
        mem = exports.get("memory")
        if not isinstance(mem, wasmtime.Memory):
            raise BackstopError("backstop.wasm: memory is not exported")
        self._mem = mem
        self._base = ctypes.addressof(mem.data_ptr(store).contents)

        maker: Callable[..., Callable[..., int]] = _SlowFn
        if fast:
            try:
                maker = _Raw(store).fn
            except (AttributeError, TypeError, ValueError):
                pass  # wasmtime's internals changed: use its public (slower) calls
        for name, (params, result) in _EXPORTS.items():
            fn = _func(store, exports, name, params, result)
            setattr(self, name, maker(store, fn, params, result, functools.partial(self._trapped, name)))

        self.buf = memoryview(b"")
        self.ensure_buffer(0)

    def _trapped(self, name: str, e: Exception) -> NoReturn:
        # A trap leaves the Go runtime in an undefined state: from now on
        # every export refuses to run, with the first trap's message.
        self._dead = BackstopError("backstop.wasm: %s trapped (the instance is no longer usable): %s" % (name, e))
        for n in _EXPORTS:
            setattr(self, n, self._refuse)
        raise self._dead from e

    def _refuse(self, *args: object) -> int:
        assert self._dead is not None
        raise self._dead

    # -- the shared buffer and memory ---------------------------------------

    def ensure_buffer(self, n: int) -> memoryview:
        """The shared buffer (``buf``), grown to at least n bytes: a view of
        guest memory to write inputs into and read batch results from."""
        if n > len(self.buf) or not self.buf:
            addr = self.buffer(n)
            if addr < 0:
                raise self.error("buffer", addr)
            size = max(n, 4096)
            self.buf = memoryview((ctypes.c_ubyte * size).from_address(self._base + addr)).cast("B")
        return self.buf

    def read(self, addr: int, n: int) -> bytes:
        """n bytes of guest memory at addr."""
        if addr < 0 or addr + n > self._mem.data_len(self._store):
            raise BackstopError("backstop.wasm: read outside memory")
        return ctypes.string_at(self._base + addr, n)

    # -- errors --------------------------------------------------------------

    def message(self) -> str:
        """The module's last error message."""
        w = self.error_message()
        return self.read((w >> 32) & 0xFFFFFFFF, w & 0xFFFFFFFF).decode("utf-8", "replace")

    def error(self, op: str, code: int) -> BackstopError:
        """The exception for a negative result of op."""
        msg = self.message()
        if code == ERR_POLICY:
            return PolicyError(msg)
        if code == ERR_INPUT:
            return InputError._from_module(msg)
        if code == ERR_HANDLE:
            return BackstopError("backstop: the policy is closed")
        return BackstopError("backstop.wasm: %s: %s (code %d)" % (op, msg, code))

    # Exports, set in __init__ (declared for type checkers).
    buffer: Callable[[int], int]
    policy_load: Callable[[int], int]
    policy_preset: Callable[[int], int]
    policy_free: Callable[[int], int]
    policy_stateful: Callable[[int], int]
    decide: Callable[..., int]
    decide_batch: Callable[[int, int, int, int], int]
    record_success: Callable[[int, int], int]
    circuit_state: Callable[[int, int], int]
    error_message: Callable[[], int]


def _func(store: wasmtime.Store, exports: Any, name: str, params: str, result: str) -> wasmtime.Func:
    """The export name, checked against its ABI signature."""
    fn = exports.get(name)
    want = "(%s) -> %s" % (", ".join(_WASM_TYPES[c] for c in params), _WASM_TYPES[result])
    if not isinstance(fn, wasmtime.Func):
        raise BackstopError("backstop.wasm: %s is not exported (want %s): not a backstop module" % (name, want))
    ty = fn.type(store)
    got = "(%s) -> %s" % (", ".join(str(t) for t in ty.params), ", ".join(str(t) for t in ty.results))
    if got != want:
        raise BackstopError("backstop.wasm: %s has signature %s, want %s" % (name, got, want))
    return fn


class _SlowFn:
    """Calls an export through wasmtime's public API (about 70 µs a call)."""

    def __init__(self, store: wasmtime.Store, fn: wasmtime.Func, params: str, result: str,
                 on_trap: Callable[[Exception], NoReturn]) -> None:
        self._store, self._fn, self._on_trap = store, fn, on_trap
        # The same checks as the fast path's struct (struct.error on a bad
        # type or range), and f64 parameters as floats, as wasmtime wants.
        self._check = struct.Struct("<" + params).pack
        self._floats = [i for i, c in enumerate(params) if c == "d"]

    def __call__(self, *args: object) -> int:
        self._check(*args)
        if self._floats:
            args = tuple(float(a) if i in self._floats else a for i, a in enumerate(args))  # type: ignore[arg-type]
        try:
            return self._fn(self._store, *args)  # type: ignore[no-any-return]
        except (wasmtime.Trap, wasmtime.WasmtimeError) as e:
            self._on_trap(e)


class _Raw:
    """The fast path: wasmtime's C API called directly through ctypes.

    wasmtime-py's ``Func.__call__`` re-reads the function type and boxes
    every value on each call (about 70 µs); ``wasmtime_func_call_unchecked``
    with a preallocated argument array takes about 1 µs. The types were
    checked once, by ``_func``. This relies on wasmtime-py internals
    (``_ffi.dll``, ``Func._func``, ``Store._context``);
    when they change, ``Instance`` falls back to the public API.
    """

    def __init__(self, store: wasmtime.Store) -> None:
        from wasmtime import _ffi as ffi

        # dll[name] makes a new function object, so setting its types does
        # not change the one wasmtime-py uses.
        self._call = ffi.dll["wasmtime_func_call_unchecked"]
        self._call.restype = ctypes.c_void_p
        self._call.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        self._ffi = ffi
        self._ctx = ctypes.cast(store._context(), ctypes.c_void_p).value

    def fn(self, store: wasmtime.Store, fn: wasmtime.Func, params: str, result: str,
           on_trap: Callable[[Exception], NoReturn]) -> Callable[..., int]:
        ffi, call, ctx = self._ffi, self._call, self._ctx
        # wasmtime_val_raw_t is a 16-byte union: each value takes one slot,
        # written in place by a precompiled struct.
        slots = (ffi.wasmtime_val_raw_t * max(len(params), 1))()
        pack = struct.Struct("<" + "".join(c + ("12x" if c == "i" else "8x") for c in params)).pack_into
        unpack = struct.Struct("<" + result).unpack_from
        trap = ctypes.c_void_p()
        fn_addr, slots_addr, trap_addr, n = ctypes.addressof(fn._func), ctypes.addressof(slots), ctypes.addressof(trap), len(slots)

        def raw_call(*args: object) -> int:
            pack(slots, 0, *args)
            err = call(ctx, fn_addr, slots_addr, n, trap_addr)
            if err or trap.value:
                on_trap(_error(ffi, err, trap))
            return unpack(slots, 0)[0]  # type: ignore[no-any-return]

        return raw_call


def _error(ffi: Any, err: Optional[int], trap: ctypes.c_void_p) -> Exception:
    # Hand the pointers to wasmtime-py's types, which own and free them.
    if trap.value:
        ptr = ctypes.cast(ctypes.c_void_p(trap.value), ctypes.POINTER(ffi.wasm_trap_t))
        trap.value = None
        return wasmtime.Trap._from_ptr(ptr)
    return wasmtime.WasmtimeError._from_ptr(ctypes.cast(ctypes.c_void_p(err), ctypes.POINTER(ffi.wasmtime_error_t)))


# -- the compiled-module cache ----------------------------------------------


def default_cache_dir() -> Optional[Path]:
    """Where compiled modules are cached: $BACKSTOP_CACHE_DIR (empty: no
    cache), else $XDG_CACHE_HOME/backstop, else ~/.cache/backstop."""
    env = os.environ.get("BACKSTOP_CACHE_DIR")
    if env is not None:
        return Path(env) if env else None
    base = os.environ.get("XDG_CACHE_HOME") or os.environ.get("LOCALAPPDATA")
    if base:
        return Path(base) / "backstop"
    try:
        return Path.home() / ".cache" / "backstop"
    except RuntimeError:  # no home directory
        return None


def load_module(engine: wasmtime.Engine, wasm: bytes, cache_dir: Optional[Path]) -> wasmtime.Module:
    """Compiles wasm, or loads its compiled form from cache_dir.

    Compiling backstop.wasm takes about a second; loading the cached
    machine code takes under a millisecond. The key covers the module's
    bytes and the wasmtime library, whose serialized format changes between
    versions. Any cache problem (unwritable, foreign-owned, stale) falls back
    to compiling.
    """
    if cache_dir is None:
        return wasmtime.Module(engine, wasm)
    path = cache_dir / ("backstop-%s.cwasm" % _cache_key(wasm))
    if _trusted(path):
        try:
            return wasmtime.Module.deserialize_file(engine, str(path))
        except wasmtime.WasmtimeError:
            pass  # another wasmtime build or configuration: recompile
    module = wasmtime.Module(engine, wasm)
    try:
        cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name("%s.%d.tmp" % (path.name, os.getpid()))
        tmp.write_bytes(module.serialize())
        os.replace(tmp, path)  # atomic: readers never see half a file
        # Drop entries of other module or wasmtime versions unused for a
        # week (9 MiB each); a live one is only rebuilt once if caught.
        for old in cache_dir.glob("backstop-*.cwasm"):
            if old != path and time.time() - old.stat().st_mtime > 7 * 86400:
                old.unlink()
    except OSError:
        pass
    return module


def _cache_key(wasm: bytes) -> str:
    from wasmtime import _ffi as ffi

    h = hashlib.sha256(wasm)
    try:
        st = os.stat(ffi.dll._name)
        h.update(("%s:%d:%d" % (ffi.dll._name, st.st_size, st.st_mtime_ns)).encode())
    except (AttributeError, OSError):
        h.update(b"unknown wasmtime")
    return h.hexdigest()[:32]


def _trusted(path: Path) -> bool:
    # A cached module is native code: load only our own file from a
    # directory nobody else can write to.
    try:
        st, dst = path.stat(), path.parent.stat()
    except OSError:
        return False
    if hasattr(os, "getuid"):
        uid = os.getuid()
        return st.st_uid == uid and dst.st_uid == uid and not dst.st_mode & 0o022
    return True


# -- the process-wide instance ------------------------------------------------

_shared: Optional[Instance] = None
_shared_lock = threading.Lock()


def shared() -> Instance:
    """The process's instance, started on first use. It holds the handles of
    every policy; its lock serialises their calls."""
    global _shared
    if _shared is None:
        with _shared_lock:
            if _shared is None:
                _shared = Instance()
    return _shared
