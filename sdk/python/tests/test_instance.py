"""The module instance: its memory stays bounded, its clock is virtual, and
a trap retires only that instance (wasm/ABI.md, "Clocks" and "When an
instance traps")."""

import pytest

import backstop
from backstop import BackstopError
from backstop._policy import load_into
from backstop._host.runtime import Instance, StateLostError, shared

PAGE = 64 << 10
MAX_BUFFER = 64 << 20

STATEFUL = (b'{"max_attempts": 8, "retry_budget": {"type": "token_bucket", "max_tokens": 6, "token_ratio": 0.5},'
            b' "circuit_breaker": {"failure_threshold": 4, "open_for": "2s", "half_open_successes": 1}}')
FAILURE = {"attempt": 1, "http_status": 503, "now_ms": 1_700_000_000_000, "random": 0.5}


def pages(inst: Instance) -> int:
    return inst._mem.data_len(inst._store) // PAGE


def policy_3900() -> bytes:
    """A policy of about 3.9 KB: a long classification table."""
    head = '{"max_attempts": 8, "backoff": {"strategy": "exponential", "base": "1s", "multiplier": 2, "cap": "300s"}, "classify": {"http": {'
    entries = []
    code = 100
    while len(head) + sum(len(e) + 2 for e in entries) < 3850:
        entries.append('"%d": "permanent"' % code)
        code += 1
    return (head + ", ".join(entries) + "}}}").encode()


def test_load_close_memory_is_bounded():
    inst = Instance()
    data = policy_3900()
    for _ in range(1500):
        load_into(inst, data).close()
    assert pages(inst) <= 400  # about 150 are used


def test_buffer_growth_is_bounded():
    # Growing the buffer a little at a time to its maximum used to leave
    # about 6,100 pages (385 MiB) of memory behind, and to trap at 28 MiB
    # when the GC had stopped.
    inst = Instance()
    with inst.lock:
        for n in range(PAGE, MAX_BUFFER + 1, PAGE):
            assert len(inst.ensure_buffer(n)) >= n
        assert pages(inst) <= 3 * MAX_BUFFER // PAGE
        with pytest.raises(BackstopError, match=r"size must be in 0\.\.67108864 \(got 67108865\)"):
            inst.ensure_buffer(MAX_BUFFER + 1)
        inst.ensure_buffer(16)[:4] = b"ok!!"  # still usable


def test_clock_is_virtual():
    # The module reads virtual time, never the host's: 1 ms per call, 1 ns
    # per reading, whatever the host's clock does meanwhile.
    inst = Instance()
    for _ in range(50):
        p = load_into(inst, '{"max_attempts": 3, "classify": {"http": {"418": "retryable"}}}')
        p.decide(attempt=1, http_status=418)
        p.close()
    calls, readings = divmod(inst._clock.ns, 1_000_000)
    # 50 × (load, stateful, on_open, connect_timeout, free) plus start-up;
    # decide does not step. The Go runtime reads the clock about 20 times
    # per GC cycle.
    assert 250 <= calls <= 270 and 0 < readings < 100_000


def exhaust_memory(inst: Instance) -> None:
    """Makes the instance trap cheaply and for real: with its memory grown
    to the wasm32 maximum, a 40 MiB buffer runs the Go runtime inside out
    of memory."""
    inst._mem.grow(inst._store, 65536 - inst._mem.size(inst._store))
    with inst.lock, pytest.raises(BackstopError, match="buffer trapped"):
        inst.ensure_buffer(40 << 20)


def test_trap_retires_only_its_instance():
    inst = Instance()
    stateless = load_into(inst, "default")
    stateful = load_into(inst, STATEFUL)
    assert stateful.stateful and not stateless.stateful
    before = stateless.decide(FAILURE)
    stateful.decide(FAILURE)

    exhaust_memory(inst)

    for _ in range(2):  # the same error every time
        for call in (lambda: stateful.decide(FAILURE), lambda: stateful.decide_many([FAILURE]),
                     lambda: stateful.record_success(FAILURE["now_ms"]), lambda: stateful.circuit_state(FAILURE["now_ms"]),
                     lambda: stateful.acquire(FAILURE["now_ms"]), lambda: stateful.budget_tokens(FAILURE["now_ms"])):
            with pytest.raises(StateLostError, match=r"retry budget and circuit breaker were lost .*\(buffer: .*unreachable.*\); load the policy again$"):
                call()
    stateful.close()

    assert stateless.decide(FAILURE) == before
    assert stateless.decide_many([FAILURE, FAILURE]) == [before, before]
    fresh = load_into(inst, "default")
    assert fresh.decide(FAILURE) == before
    again = load_into(inst, STATEFUL)
    assert again.stateful and again.decide(FAILURE).retry
    stateless.close()
    fresh.close()
    again.close()
    assert not inst._loaded  # closing forgets them


def test_trap_in_the_shared_instance_spares_the_process():
    # A trap in the process's instance used to make every policy fail,
    # load_policy("default") included.
    stateless = backstop.load_policy("default")
    stateful = backstop.load_policy(STATEFUL)
    stateful.decide(FAILURE)

    exhaust_memory(shared())

    with pytest.raises(backstop.StateLostError, match="retry budget and circuit breaker were lost"):
        stateful.decide(FAILURE)
    assert stateless.decide(FAILURE).retry
    assert backstop.load_policy("default").decide(FAILURE).retry
    assert backstop.load_policy(STATEFUL).decide(FAILURE).retry


def test_no_fresh_instance_retires_the_instance(monkeypatch):
    # If no fresh module instance can start after a trap, every call fails
    # with that reason, and the process's next load starts a new Instance.
    import backstop._host.runtime as runtime

    inst = shared()
    p = backstop.load_policy("default")

    def cannot_start() -> None:
        raise BackstopError("backstop.wasm: cannot start: no memory")

    monkeypatch.setattr(inst, "_start", cannot_start)
    inst._mem.grow(inst._store, 65536 - inst._mem.size(inst._store))
    with inst.lock, pytest.raises(BackstopError, match=r"buffer trapped \(the instance is no longer usable: .*cannot start"):
        inst.ensure_buffer(40 << 20)
    with pytest.raises(BackstopError, match="no longer usable"):
        p.decide(FAILURE)
    assert runtime.shared() is not inst
    assert backstop.load_policy("default").decide(FAILURE).retry


# A module that calls the WASI clock and sleep the host defines.
CLOCK_PROBE = """(module
  (import "wasi_snapshot_preview1" "clock_time_get" (func $clock (param i32 i64 i32) (result i32)))
  (import "wasi_snapshot_preview1" "poll_oneoff" (func $poll (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "now") (param $id i32) (result i64)
    (if (i32.ne (call $clock (local.get $id) (i64.const 0) (i32.const 8)) (i32.const 0))
      (then (return (i64.const -1))))
    (i64.load (i32.const 8)))
  (func (export "poll") (param i32 i32 i32 i32) (result i32)
    (call $poll (local.get 0) (local.get 1) (local.get 2) (local.get 3))))"""


def test_wasi_clocks_are_virtual():
    # 1 ns per reading, sleeps return at once and move time on.
    import ctypes
    import struct

    import wasmtime

    from backstop._host.runtime import _Clock, _define_clock

    engine = wasmtime.Engine()
    store = wasmtime.Store(engine)
    linker = wasmtime.Linker(engine)
    clock = _Clock()
    memory = [None, 0]
    _define_clock(linker, store, clock, memory)
    exports = linker.instantiate(store, wasmtime.Module(engine, wasmtime.wat2wasm(CLOCK_PROBE))).exports(store)
    mem = exports["memory"]
    memory[:] = [mem, ctypes.addressof(mem.data_ptr(store).contents)]
    now, poll = exports["now"], exports["poll"]
    assert now(store, 1) == 1
    assert now(store, 1) == 2
    assert now(store, 0) == 1_640_995_200_000_000_003  # 2022-01-01T00:00:00Z + 3 ns
    assert now(store, 2) == -1  # EINVAL: no CPU-time clocks
    clock.ns += 1_000_000  # what a host does before a call
    assert now(store, 1) == 1_000_004
    # A sleep: one relative clock subscription of 5 ms (userdata 7).
    sub = struct.pack("<QB7xI4xQQH6x", 7, 0, 1, 5_000_000, 0, 0)
    mem.write(store, sub, 64)
    assert poll(store, 64, 128, 1, 200) == 0
    assert struct.unpack_from("<QHB", mem.read(store, 128, 160)) == (7, 0, 0)
    assert struct.unpack("<I", mem.read(store, 200, 204)) == (1,)
    assert clock.ns == 6_000_004
    # Until an absolute time on the monotonic clock.
    mem.write(store, struct.pack("<QB7xI4xQQH6x", 7, 0, 1, 10_000_000, 0, 1), 64)
    poll(store, 64, 128, 1, 200)
    assert clock.ns == 10_000_000


def test_a_policy_collected_while_its_instance_is_busy_frees_later_without_deadlock():
    """The garbage collector may finalize a Policy in a thread that holds
    the instance's lock (between two calls of a batch, in a WASI callback).
    The finalizer must not wait for the lock (a deadlock: the lock is not
    reentrant); the handle is freed by the next load."""
    import gc
    import threading

    from backstop._host import abi

    inst = Instance()
    p = load_into(inst, b"{}")
    handle = p._h

    def collect_while_busy():
        nonlocal p
        with inst.lock:
            del p
            gc.collect()

    t = threading.Thread(target=collect_while_busy, daemon=True)
    t.start()
    t.join(60)  # a hang guard, not a timing check: the old finalizer never returned
    assert not t.is_alive(), "the finalizer waited for a lock its own thread held"
    assert (inst, handle) in abi._collected
    load_into(inst, b"{}").close()
    assert all(owner is not inst for owner, _ in abi._collected)
