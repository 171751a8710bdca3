"""backstop.wasm under wasmtime: compile (cached on disk), instantiate, call.

This is the only module that touches wasmtime. It follows wasm/ABI.md;
``abi.py`` beside it encodes what goes in and decodes what comes out.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import logging
import os
import platform
import struct
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, NoReturn, Optional, Tuple

import wasmtime

from .._errors import BackstopError, InputError, PolicyError

#: The version of wasm/ABI.md this host implements.
ABI_VERSION = 1

# Error codes (ABI.md, "Error codes").
ERR_HANDLE, ERR_POLICY, ERR_INPUT = -1, -2, -3

# The module's virtual time (ABI.md, "Clocks"): the realtime clock's epoch
# (2022-01-01T00:00:00Z) and the step before each call, in nanoseconds.
_EPOCH_NS = 1_640_995_200_000_000_000
_CALL_NS = 1_000_000
_EINVAL = 28

# The hot path: no clock step before these calls (ABI.md allows it), and
# the exports whose first parameter is a policy handle.
_HOT = frozenset(("decide", "decide_batch"))
_BY_HANDLE = ("decide", "decide_batch", "record_success", "record_duration", "circuit_state", "acquire", "policy_on_open", "policy_lints",
              "budget_tokens", "attempt_timeout", "connect_timeout", "outcome", "decide_value", "outcome_value")

# Handles the module gives out are 1..65536; after a restart the host's own
# handles start above them.
_MAX_HANDLES = 1 << 16

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
    "record_duration": ("iqq", "i"),
    "circuit_state": ("iq", "i"),
    "acquire": ("iq", "q"),
    "policy_on_open": ("i", "i"),
    "policy_lints": ("i", "q"),
    "budget_tokens": ("iq", "q"),
    "attempt_timeout": ("iq", "q"),
    "connect_timeout": ("i", "q"),
    "outcome": ("iiqiiqqdqiiiiqq", "q"),
    "decide_value": ("ii", "q"),
    "outcome_value": ("iiiqq", "q"),
    "error_message": ("", "q"),
}
_WASM_TYPES = {"i": "i32", "q": "i64", "d": "f64"}

# The package data: backstop/backstop.wasm, beside backstop/_host/.
_WASM_FILE = Path(__file__).parent.parent / "backstop.wasm"

#: The wasmtime releases (first and last major version) the fast path is
#: proven on: pyproject.toml allows exactly these, and `make test` runs the
#: whole suite on the oldest and the newest. Any other takes the public API.
WASMTIME_PROVEN = (48, 50)

# How every Instance configures its Engine, as (Config attribute, value):
# part of the compiled-module cache key. Memory never moves (it reserves its
# whole 4 GiB range instead), so the address of the shared buffer stays
# valid across calls. On x86-64, Winch (wasmtime's baseline compiler)
# compiles backstop.wasm 7-8x faster than Cranelift (BENCHMARKS.md): a
# first load_policy the user does not wait a second for, while a decision
# stays dominated by the call from Python. Elsewhere Cranelift: Winch's
# other backends do not cover every instruction.
_ENGINE_SETTINGS: Tuple[Tuple[str, Any], ...] = (("memory_may_move", False),) + (
    (("strategy", "winch"),) if platform.machine().lower() in ("x86_64", "amd64") else ())

# Strategies wasmtime-py's Config.strategy does not spell (it knows "auto"
# and "cranelift"), set through the C API: wasmtime_strategy_t's
# WASMTIME_STRATEGY_WINCH is 2 in every release of WASMTIME_PROVEN.
_C_STRATEGIES = {"winch": 2}

# BACKSTOP_FAST_PATH=0 turns the fast path off (wasmtime's public API only).
_FAST_ENV = "BACKSTOP_FAST_PATH"

_log = logging.getLogger("backstop")


class _Clock:
    """An instance's virtual time, in nanoseconds (ABI.md, "Clocks")."""

    __slots__ = ("ns",)

    def __init__(self) -> None:
        self.ns = 0


class _Loaded:
    """A policy loaded through an Instance: what a fresh module instance
    needs to load it again, and its handle in the current one."""

    __slots__ = ("data", "preset", "stateful", "handle", "lost")

    def __init__(self, data: Optional[bytes], preset: bool, stateful: bool, handle: int) -> None:
        self.data = data  # None for a stateful policy: its state cannot move
        self.preset = preset
        self.stateful = stateful
        self.handle = handle
        self.lost: Optional[BackstopError] = None


class StateLostError(BackstopError):
    """Raised by every call on a stateful policy whose module instance
    trapped: its retry budget and circuit breaker were lost with it
    (wasm/ABI.md, "When an instance traps"). Load the policy again."""


class _Trap(Exception):
    """A trap while an Instance is restarting (internal)."""


class Instance:
    """backstop.wasm under wasmtime: a module instance in its own Store.

    A module instance is single-threaded: every call must hold ``lock``.

    A trap leaves the Go runtime inside broken, so the module instance is
    replaced at once by a fresh one (ABI.md, "When an instance traps"). The
    policies loaded through this Instance keep their handles: stateless
    ones are loaded again into the fresh instance; stateful ones, whose
    budget and breaker were lost, raise ``StateLostError`` on every call. Until the first trap, handles are the module's own and the hot
    path calls the module directly; after it, they are mapped.
    """

    def __init__(self, wasm: Optional[bytes] = None, *, cache_dir: Any = "default", fast: bool = True) -> None:
        """Starts backstop.wasm (or wasm), caching its compiled form in
        cache_dir (None: no cache), and calling it through wasmtime's C API
        unless fast is false."""
        if wasm is None:
            wasm = _WASM_FILE.read_bytes()
        if cache_dir == "default":
            cache_dir = default_cache_dir()
        self._engine = _new_engine(_ENGINE_SETTINGS)
        self._module = load_module(self._engine, wasm, cache_dir, _ENGINE_SETTINGS)
        self._fast = fast
        self.lock = threading.Lock()
        self._dead: Optional[BackstopError] = None
        self._loaded: Dict[int, _Loaded] = {}  # by the handle this Instance gave out
        self._remap = False  # set by the first restart: handles are no longer the module's
        self._next = _MAX_HANDLES + 1
        self._restarting = False
        self._start()
        self._install()

    def _start(self) -> None:
        """Starts a fresh module instance (store, clock, exports, buffer)."""
        engine = self._engine
        # WASI granting nothing: no preopened directories, no environment,
        # no arguments, no inherited stdio. The Go runtime reads the clock,
        # which is virtual, and the random source, to start and to pace its
        # garbage collector.
        store = wasmtime.Store(engine)
        store.set_wasi(wasmtime.WasiConfig())
        linker = wasmtime.Linker(engine)
        linker.allow_shadowing = True
        linker.define_wasi()
        clock = _Clock()
        memory: List[Any] = [None, 0]  # the Memory and its address, once instantiated
        _define_clock(linker, store, clock, memory)
        try:
            exports = linker.instantiate(store, self._module).exports(store)
            mem = exports.get("memory")
            if isinstance(mem, wasmtime.Memory):
                memory[:] = [mem, ctypes.addressof(mem.data_ptr(store).contents)]
            init = exports.get("_initialize")  # a WASI reactor starts its runtime here
            if isinstance(init, wasmtime.Func):
                init(store)
            version = _func(store, exports, "abi_version", "", "i")(store)
        except (wasmtime.WasmtimeError, wasmtime.Trap) as e:
            raise BackstopError("backstop.wasm: cannot start: %s" % e) from e
        if version != ABI_VERSION:
            raise BackstopError(
                "backstop.wasm ABI version %d is not supported by this host (want %d): "
                "install the backstop-policy release that matches the module" % (version, ABI_VERSION))
        if not isinstance(mem, wasmtime.Memory):
            raise BackstopError("backstop.wasm: memory is not exported")

        maker: Callable[..., Callable[..., int]] = _SlowFn
        if self._fast:
            if _RAW_PROBLEM is not None:
                _public_api(*_RAW_PROBLEM)
            else:
                try:
                    maker = _Raw(store).fn
                except (AttributeError, TypeError, ValueError) as e:
                    _public_api(logging.WARNING, "wasmtime's internals are not what the fast path expects (%s)" % e)
        raw: Dict[str, Callable[..., int]] = {}
        for name, (params, result) in _EXPORTS.items():
            fn = _func(store, exports, name, params, result)
            tick = None if name in _HOT else clock
            raw[name] = maker(store, fn, params, result, functools.partial(self._trapped, name), tick)

        self._store = store
        self._exports = exports  # keeps the Func objects alive for the fast path
        self._mem = mem
        self._base = memory[1]
        self._clock = clock
        self._raw = raw
        self.buffer = raw["buffer"]
        self.error_message = raw["error_message"]
        self.buf = memoryview(b"")
        self.ensure_buffer(0)

    def _install(self) -> None:
        """Sets the exports callers use: the module's own for the hot path
        while handles are the module's, mapping ones after a restart."""
        raw = self._raw
        self.policy_load = functools.partial(self._load, "policy_load")
        self.policy_preset = functools.partial(self._load, "policy_preset")
        self.policy_free = self._free
        self.policy_stateful = self._stateful
        for name in _BY_HANDLE:
            setattr(self, name, _mapped(raw[name], self._handle) if self._remap else raw[name])

    # -- policies ------------------------------------------------------------

    def _load(self, name: str, n: int) -> int:
        """policy_load or policy_preset of buffer[0:n], remembering the bytes
        of a stateless policy so that a fresh instance can load it again."""
        data = bytes(self.buf[:n]) if 0 <= n <= len(self.buf) else b""
        h = self._raw[name](n)
        if h <= 0:
            return h
        stateful = self._raw["policy_stateful"](h) == 1
        if self._remap:
            handle, self._next = self._next, self._next + 1
        else:
            handle = h
        self._loaded[handle] = _Loaded(None if stateful else data, name == "policy_preset", stateful, h)
        return handle

    def _free(self, handle: int) -> int:
        loaded = self._loaded.pop(handle, None)
        if loaded is None:
            return ERR_HANDLE
        if loaded.lost is not None:
            return 0  # it went with its instance
        return self._raw["policy_free"](loaded.handle)

    def _stateful(self, handle: int) -> int:
        loaded = self._loaded.get(handle)
        if loaded is None:
            return ERR_HANDLE
        return 1 if loaded.stateful else 0

    def _handle(self, handle: int) -> int:
        """The module's handle for one this Instance gave out (after a
        restart). Raises the error of a policy lost in a trap."""
        loaded = self._loaded.get(handle)
        if loaded is None:
            return 0  # closed: the module answers ERR_HANDLE
        if loaded.lost is not None:
            raise loaded.lost
        return loaded.handle

    # -- traps ---------------------------------------------------------------

    def _trapped(self, name: str, e: Exception) -> NoReturn:
        # A trap leaves the Go runtime in an undefined state: the module
        # instance is never called again. A fresh one takes its place.
        if self._restarting:
            raise _Trap(name, e)
        lost = StateLostError(
            "backstop: the policy's retry budget and circuit breaker were lost with the module instance "
            "that held them, which trapped (%s: %s); load the policy again" % (name, _last_line(e)))
        for loaded in self._loaded.values():
            if loaded.stateful and loaded.lost is None:
                loaded.lost = lost
        try:
            self._restart()
            err = BackstopError("backstop.wasm: %s trapped (the instance was replaced by a fresh one): %s" % (name, e))
        except (BackstopError, _Trap) as restart:
            # No fresh instance: every export refuses from now on.
            self._dead = err = BackstopError(
                "backstop.wasm: %s trapped (the instance is no longer usable: %s): %s" % (name, restart, e))
            for n in _EXPORTS:
                setattr(self, n, self._refuse)
        raise err from e

    def _restart(self) -> None:
        """Replaces the module instance with a fresh one and loads the
        stateless policies into it again. One that traps on the way (it
        loaded before, so it should not) is given up as lost."""
        self._restarting = True
        try:
            while True:
                self._start()
                try:
                    for loaded in self._loaded.values():
                        if loaded.lost is None:
                            loaded.handle = self._reload(loaded)
                    break
                except _Trap as t:
                    loaded.lost = StateLostError(
                        "backstop: the policy could not be loaded again after its module instance trapped (%s); "
                        "load it again" % _last_line(t.args[1]))
        finally:
            self._restarting = False
        self._remap = True
        self._install()

    def _reload(self, loaded: _Loaded) -> int:
        data = loaded.data or b""
        self.ensure_buffer(len(data))[:len(data)] = data
        h = self._raw["policy_preset" if loaded.preset else "policy_load"](len(data))
        if h <= 0:
            raise _Trap("policy_load", BackstopError(self.message()))
        return h

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
    record_duration: Callable[[int, int, int], int]
    circuit_state: Callable[[int, int], int]
    acquire: Callable[[int, int], int]
    policy_on_open: Callable[[int], int]
    policy_lints: Callable[[int], int]
    budget_tokens: Callable[[int, int], int]
    attempt_timeout: Callable[[int, int], int]
    connect_timeout: Callable[[int], int]
    outcome: Callable[..., int]
    decide_value: Callable[[int, int], int]
    outcome_value: Callable[[int, int, int, int, int], int]
    error_message: Callable[[], int]


def _last_line(e: BaseException) -> str:
    """The gist of an error whose message may be a backtrace: its last line."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[-1] if lines else type(e).__name__


def _mapped(fn: Callable[..., int], handle: Callable[[int], int]) -> Callable[..., int]:
    """fn with its first parameter, a handle, mapped by handle."""

    def call(h: int, *args: Any) -> int:
        return fn(handle(h), *args)

    return call


def _define_clock(linker: wasmtime.Linker, store: wasmtime.Store, clock: _Clock, memory: List[Any]) -> None:
    """Defines the WASI clock and sleep over virtual time (ABI.md,
    "Clocks"), in place of wasmtime's, which read the host's clock and
    really sleep. memory holds the Memory and its address once known."""
    i32, i64 = wasmtime.ValType.i32(), wasmtime.ValType.i64()

    def fits(ptr: int, n: int) -> bool:
        return memory[0] is not None and 0 <= ptr and ptr + n <= memory[0].data_len(store)

    def clock_time_get(clock_id: int, _precision: int, ptr: int) -> int:
        if clock_id not in (0, 1) or not fits(ptr, 8):
            return _EINVAL
        clock.ns += 1
        ctypes.c_uint64.from_address(memory[1] + ptr).value = clock.ns + (_EPOCH_NS if clock_id == 0 else 0)
        return 0

    def poll_oneoff(in_ptr: int, out_ptr: int, nsubs: int, nevents_ptr: int) -> int:
        # Every subscription completes at once. A clock one (the runtime's
        # sleep) moves virtual time on by its timeout, the shortest if several.
        if nsubs <= 0 or not (fits(in_ptr, 48 * nsubs) and fits(out_ptr, 32 * nsubs) and fits(nevents_ptr, 4)):
            return _EINVAL
        subs = ctypes.string_at(memory[1] + in_ptr, 48 * nsubs)
        events = bytearray(32 * nsubs)
        wake = None
        for i in range(nsubs):
            userdata, tag = struct.unpack_from("<QB", subs, 48 * i)
            errno = 8  # EBADF: no file descriptor is granted
            if tag == 0:
                errno = 0
                clock_id, timeout, _precision, flags = struct.unpack_from("<I4xQQH", subs, 48 * i + 16)
                if flags & 1:  # subscription_clock_abstime
                    timeout -= clock.ns + (_EPOCH_NS if clock_id == 0 else 0)
                wake = max(timeout, 0) if wake is None else min(wake, max(timeout, 0))
            struct.pack_into("<QHB", events, 32 * i, userdata, errno, tag)
        if wake is not None:
            clock.ns += wake
        ctypes.memmove(memory[1] + out_ptr, bytes(events), len(events))
        ctypes.c_uint32.from_address(memory[1] + nevents_ptr).value = nsubs
        return 0

    wasi = "wasi_snapshot_preview1"
    linker.define_func(wasi, "clock_time_get", wasmtime.FuncType([i32, i64, i32], [i32]), clock_time_get)
    linker.define_func(wasi, "poll_oneoff", wasmtime.FuncType([i32, i32, i32, i32], [i32]), poll_oneoff)


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
                 on_trap: Callable[[Exception], NoReturn], tick: Optional[_Clock]) -> None:
        self._store, self._fn, self._on_trap, self._tick = store, fn, on_trap, tick
        # The same checks as the fast path's struct (struct.error on a bad
        # type or range), and f64 parameters as floats, as wasmtime wants.
        self._check = struct.Struct("<" + params).pack
        self._floats = [i for i, c in enumerate(params) if c == "d"]

    def __call__(self, *args: object) -> int:
        self._check(*args)
        if self._floats:
            args = tuple(float(a) if i in self._floats else a for i, a in enumerate(args))  # type: ignore[arg-type]
        if self._tick is not None:
            self._tick.ns += _CALL_NS
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
    (``_ffi.dll``, ``Func._func``, ``Store._context``) and on the C
    signature of the function and the layout of ``wasmtime_val_raw_t``: a
    mistake there is a crash, not an exception. So it is used only when
    ``_raw_path_problem`` found nothing at import (``_RAW_PROBLEM``).
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
           on_trap: Callable[[Exception], NoReturn], tick: Optional[_Clock]) -> Callable[..., int]:
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

        if tick is None:
            return raw_call

        def ticking_call(*args: object) -> int:
            tick.ns += _CALL_NS  # virtual time moves on between calls
            return raw_call(*args)

        return ticking_call


def _error(ffi: Any, err: Optional[int], trap: ctypes.c_void_p) -> Exception:
    # Hand the pointers to wasmtime-py's types, which own and free them.
    if trap.value:
        ptr = ctypes.cast(ctypes.c_void_p(trap.value), ctypes.POINTER(ffi.wasm_trap_t))
        trap.value = None
        return wasmtime.Trap._from_ptr(ptr)
    return wasmtime.WasmtimeError._from_ptr(ctypes.cast(ctypes.c_void_p(err), ctypes.POINTER(ffi.wasmtime_error_t)))


# -- is the fast path safe with this wasmtime? ---------------------------------


def _wasmtime_version() -> Optional[str]:
    """The installed wasmtime's version, from its metadata beside the
    package (importlib.metadata costs 25 ms to import), or None."""
    package = Path(wasmtime.__file__).resolve().parent
    found = list(package.parent.glob("wasmtime-*.dist-info"))
    if len(found) == 1:
        head: Dict[str, str] = {}
        try:
            with open(found[0] / "METADATA", encoding="utf-8") as f:
                for line in f:  # the header, up to the first blank line
                    if not line.strip():
                        break
                    name, colon, value = line.partition(": ")
                    if colon:
                        head.setdefault(name, value.strip())
        except (OSError, UnicodeDecodeError):
            pass
        if head.get("Name", "").lower() == "wasmtime" and head.get("Version"):
            return head["Version"]
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:
        return None
    try:
        return version("wasmtime")
    except PackageNotFoundError:
        return None


def _major(version: str) -> Optional[int]:
    digits = version.split(".", 1)[0]
    return int(digits) if digits.isdigit() else None


class _SelfTestTrap(Exception):
    pass


def _self_test_trap(e: Exception) -> NoReturn:
    raise _SelfTestTrap(e)


def _self_test_module() -> Tuple[str, List[Tuple[str, str, str]]]:
    """A module with one function per signature of the ABI (and one that
    traps): each folds its parameters, in order and bit for bit, into its
    result, so a value read from the wrong slot or offset shows."""
    funcs, sigs = [], []
    for i, (params, result) in enumerate(sorted(set(_EXPORTS.values()))):
        body = ["i64.const 0x1234567"]
        for k, c in enumerate(params):
            body += ["i64.const 1000003", "i64.mul", "local.get %d" % k,
                     {"i": "i64.extend_i32_s", "q": "", "d": "i64.reinterpret_f64"}[c], "i64.xor"]
        if result == "i":
            body += ["i64.const 32", "i64.rotr", "i32.wrap_i64"]
        name = "f%d" % i
        funcs.append('(func (export "%s") %s (result %s) %s)' % (
            name, " ".join("(param %s)" % _WASM_TYPES[c] for c in params), _WASM_TYPES[result],
            " ".join(b for b in body if b)))
        sigs.append((name, params, result))
    funcs.append('(func (export "trap") (param i32) (result i32) unreachable)')
    return "(module %s)" % " ".join(funcs), sigs


# Arguments for the self-test: typical values and the extremes of each type.
_SELF_TEST_ARGS = {
    "i": (1, -1, -(1 << 31), (1 << 31) - 1, 503, 0x5A5A5A5A),
    "q": (1_700_000_000_000, -(1 << 63), (1 << 63) - 1, -2, 0x0123456789ABCDEF, 0),
    "d": (0.5, -0.0, 5e-324, -1.5e300, 0.1, 1.0),
}


def _raw_path_problem(version: Optional[str] = None) -> Optional[str]:
    """Why the fast path cannot be trusted with the installed wasmtime, or
    None. Checks, in order and without calling the C function until the
    rest holds: the version is in WASMTIME_PROVEN; ``wasmtime_val_raw_t``
    is the 16-byte union with i32, i64 and f64 at offset 0; wasmtime-py's
    own bindings (generated from the C headers it ships) still declare
    ``wasmtime_func_call_unchecked`` with the parameters the fast path
    passes; the wasmtime-py names the fast path uses exist; then calls
    through the fast path agree with the public API on every signature of
    the ABI, and a trap comes back as a ``wasmtime.Trap``."""
    if version is None:
        version = _WASMTIME_VERSION
    first, last = WASMTIME_PROVEN
    major = _major(version) if version else None
    if major is None:
        return "the installed wasmtime's version is unknown (%r)" % version
    if not first <= major <= last:
        return "wasmtime %s is outside the range the fast path is proven on (%d.x to %d.x)" % (version, first, last)
    try:
        from wasmtime import _bindings as bindings
        from wasmtime import _ffi as ffi

        raw = ffi.wasmtime_val_raw_t
        fields = dict(raw._fields_)
        for name, ctype in (("i32", ctypes.c_int32), ("i64", ctypes.c_int64), ("f64", ctypes.c_double)):
            if fields.get(name) is not ctype or getattr(raw, name).offset != 0:
                return "wasmtime_val_raw_t.%s is not a %s at offset 0" % (name, ctype.__name__)
        if ctypes.sizeof(raw) != 16 or not issubclass(raw, ctypes.Union):
            return "wasmtime_val_raw_t is not a 16-byte union (%d bytes)" % ctypes.sizeof(raw)
        P = ctypes.POINTER
        declared = bindings._wasmtime_func_call_unchecked
        want = [P(ffi.wasmtime_context_t), P(ffi.wasmtime_func_t), P(ffi.wasmtime_val_raw_t), ctypes.c_size_t,
                P(P(ffi.wasm_trap_t))]
        if list(declared.argtypes) != want or declared.restype is not P(ffi.wasmtime_error_t):
            return "wasmtime_func_call_unchecked is declared as %s -> %s, not as the fast path calls it" % (
                declared.argtypes, declared.restype)
        ffi.dll["wasmtime_func_call_unchecked"]  # the symbol itself
        for cls, name in ((wasmtime.Trap, "_from_ptr"), (wasmtime.WasmtimeError, "_from_ptr"),
                          (wasmtime.Store, "_context")):
            if not callable(getattr(cls, name, None)):
                return "wasmtime.%s.%s is missing" % (cls.__name__, name)

        wat, sigs = _self_test_module()
        engine = wasmtime.Engine()
        store = wasmtime.Store(engine)
        exports = wasmtime.Instance(store, wasmtime.Module(engine, wasmtime.wat2wasm(wat)), []).exports(store)
        if not isinstance(store._context(), P(ffi.wasmtime_context_t)):
            return "Store._context() is not a wasmtime_context_t pointer"
        fast = _Raw(store)
        for name, params, result in sigs:
            fn = exports[name]
            if not isinstance(getattr(fn, "_func", None), ffi.wasmtime_func_t):
                return "Func._func is not a wasmtime_func_t"
            call = fast.fn(store, fn, params, result, _self_test_trap, None)
            for j in range(len(_SELF_TEST_ARGS["i"])):
                args = [_SELF_TEST_ARGS[c][(j + k) % len(_SELF_TEST_ARGS[c])] for k, c in enumerate(params)]
                got, want_result = call(*args), fn(store, *args)
                if got != want_result:
                    return "a call through the fast path returned %r where the public API returned %r (%s%s)" % (
                        got, want_result, name, tuple(args))
        trap = fast.fn(store, exports["trap"], "i", "i", _self_test_trap, None)
        try:
            trap(0)
            return "a trap through the fast path went unnoticed"
        except _SelfTestTrap as t:
            if not isinstance(t.args[0], wasmtime.Trap):
                return "a trap through the fast path came back as %r" % (t.args[0],)
    except Exception as e:  # anything unexpected: not proven
        return "cannot check wasmtime's internals (%s: %s)" % (type(e).__name__, e)
    return None


_logged = False
_logged_lock = threading.Lock()


def _public_api(level: int, why: str) -> None:
    """Says once per process why calls go through wasmtime's public API."""
    global _logged
    with _logged_lock:
        if _logged:
            return
        _logged = True
    _log.log(level, "backstop: calling backstop.wasm through wasmtime's public API (slower): %s", why)


def _fast_path_setting() -> Optional[Tuple[int, str]]:
    """None when the fast path may be used, else the level and the reason
    to log: turned off by BACKSTOP_FAST_PATH=0, or not proven."""
    if os.environ.get(_FAST_ENV, "").strip().lower() in ("0", "false", "off", "no"):
        return logging.INFO, "the fast path is turned off (%s=%s)" % (_FAST_ENV, os.environ[_FAST_ENV])
    problem = _raw_path_problem()
    return None if problem is None else (logging.WARNING, problem)


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


def _new_engine(settings: Tuple[Tuple[str, Any], ...]) -> wasmtime.Engine:
    """An Engine whose Config has settings (attribute, value) applied. A
    setting wasmtime no longer has raises, rather than setting a plain
    attribute that changes nothing (memory that may move would leave the
    shared buffer's address dangling)."""
    config = wasmtime.Config()
    for name, value in settings:
        if not isinstance(getattr(wasmtime.Config, name, None), property):
            raise BackstopError("backstop: this wasmtime has no engine setting %s" % name)
        if name == "strategy" and value in _C_STRATEGIES:
            from wasmtime import _ffi as ffi

            ffi.wasmtime_config_strategy_set(config.ptr(), _C_STRATEGIES[value])
            continue
        setattr(config, name, value)
    return wasmtime.Engine(config)


def load_module(engine: wasmtime.Engine, wasm: bytes, cache_dir: Optional[Path],
                settings: Tuple[Tuple[str, Any], ...] = ()) -> wasmtime.Module:
    """Compiles wasm, or loads its compiled form from cache_dir. settings
    are those engine was made with (``_new_engine``; none: wasmtime's
    defaults).

    Compiling backstop.wasm takes about a second with Cranelift, a third
    of that with Winch (_ENGINE_SETTINGS); loading the cached machine code
    takes under a millisecond. A cache entry is two files
    named by its key: ``backstop-KEY.cwasm``, the compiled module, and
    ``backstop-KEY.json``, what it was compiled from and for
    (``_cache_facts``: the module's bytes, the wasmtime version and
    library, the engine settings, the CPU). The module is loaded only when
    its facts file matches this process's facts exactly: a file written by
    another wasmtime, configuration or CPU is never handed to wasmtime,
    whose loader trusts what it maps. Any cache problem (unwritable,
    foreign-owned, stale, unknown wasmtime) falls back to compiling.
    """
    facts = _cache_facts(wasm, settings) if cache_dir is not None else None
    if cache_dir is None or facts is None:
        _compiling(logging.INFO, "no cache: every process compiles it")
        return wasmtime.Module(engine, wasm)
    text = json.dumps(facts, sort_keys=True, separators=(",", ":"))
    stem = "backstop-%s" % hashlib.sha256(text.encode()).hexdigest()[:32]
    path, facts_path = cache_dir / (stem + ".cwasm"), cache_dir / (stem + ".json")
    if _trusted(path) and _trusted(facts_path):
        try:
            same = facts_path.read_text(encoding="utf-8") == text
        except (OSError, UnicodeDecodeError):
            same = False
        if same:
            try:
                return wasmtime.Module.deserialize_file(engine, str(path))
            except wasmtime.WasmtimeError:
                pass  # damaged: recompile
    _compiling(logging.WARNING, "once: the result is cached in %s" % cache_dir)
    module = wasmtime.Module(engine, wasm)
    try:
        cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        # The module first, then its facts: a reader that sees the new
        # facts sees the module they describe (same key, same facts).
        for target, data in ((path, module.serialize()), (facts_path, text.encode())):
            tmp = target.with_name("%s.%d.tmp" % (target.name, os.getpid()))
            tmp.write_bytes(data)
            os.replace(tmp, target)  # atomic: readers never see half a file
        # Drop entries of other module or wasmtime versions unused for a
        # week (9-13 MiB each); a live one is only rebuilt once if caught.
        for old in cache_dir.glob("backstop-*"):
            if old.suffix in (".cwasm", ".json", ".tmp") and old.name[:len(stem)] != stem \
                    and time.time() - old.stat().st_mtime > 7 * 86400:
                old.unlink()
    except OSError:
        pass
    return module


_compile_logged = False


def _compiling(level: int, why: str) -> None:
    """Says once per process, before it starts, that a compile is under way:
    on a machine without the compiled module cached, the first load_policy
    waits for it (about a second; README, "The compiled-module cache")."""
    global _compile_logged
    with _logged_lock:
        if _compile_logged:
            return
        _compile_logged = True
    _log.log(level, "backstop: compiling backstop.wasm for this machine, up to a second (%s)", why)


def _cache_facts(wasm: bytes, settings: Tuple[Tuple[str, Any], ...]) -> Optional[Dict[str, Any]]:
    """Everything the compiled code depends on, or None if the wasmtime
    library cannot be identified (then nothing is cached)."""
    from wasmtime import _ffi as ffi

    try:
        lib = Path(ffi.dll._name)
        st = lib.stat()
    except (AttributeError, OSError, TypeError):
        return None
    if _WASMTIME_VERSION is None:
        return None
    return {
        "cache": 1,  # this format
        "module": hashlib.sha256(wasm).hexdigest(),
        "wasmtime": _WASMTIME_VERSION,
        "library": [str(lib), st.st_size, st.st_mtime_ns],
        "engine": [[name, value] for name, value in settings],
        "machine": platform.machine(),
        # wasmtime compiles for the host CPU's features and refuses a module
        # compiled for features this CPU lacks: one entry per CPU (a home
        # directory shared by several machines).
        "cpu": _CPU_FEATURES,
    }


def _cpu_features() -> str:
    """The CPU's feature flags (Linux: /proc/cpuinfo), hashed; elsewhere
    the processor's name."""
    try:
        with open("/proc/cpuinfo", "rb") as f:
            flags = sorted({line.split(b":", 1)[1].strip() for line in f
                            if line.split(b":", 1)[0].strip() in (b"flags", b"Features") and b":" in line})
        if flags:
            return hashlib.sha256(b"\n".join(flags)).hexdigest()[:32]
    except OSError:
        pass
    return platform.processor() or "unknown"


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
    every policy; its lock serialises their calls. A trap replaces its module
    instance; in the unlikely case that no fresh one could start, the next
    call starts another Instance."""
    global _shared
    inst = _shared
    if inst is None or inst._dead is not None:
        with _shared_lock:
            if _shared is None or _shared._dead is not None:
                _shared = Instance()
            inst = _shared
    return inst


# -- at import: what this wasmtime is and whether the fast path holds ----------

_WASMTIME_VERSION = _wasmtime_version()
_CPU_FEATURES = _cpu_features()
_RAW_PROBLEM = _fast_path_setting()
