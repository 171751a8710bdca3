"""The policy API, the runtime (ABI version, compile cache) and threads."""

import os
import threading
from datetime import timedelta
from enum import Enum

import pytest
import wasmtime

import backstop
from backstop import BackstopError, Decision, InputError, PolicyError
from backstop._host.runtime import Instance, load_module

NO_JITTER = {"max_attempts": 5, "backoff": {"strategy": "exponential", "base": "100ms", "cap": "10s"}, "jitter": {"mode": "none"}}


def test_decide_dict_and_keywords():
    p = backstop.load_policy("default")
    d = p.decide(attempt=1, http_status=503, random=0.5, now_ms=0)
    assert d == Decision("retry", 500, "transient", "retryable")
    assert p.decide({"attempt": 1, "http_status": 503}, random=0.5, now_ms=0) == d
    assert d.retry and d.delay == timedelta(milliseconds=500) and d.delay_seconds == 0.5
    assert list(d.to_dict()) == ["action", "delay_ms", "reason", "class"]
    with pytest.raises(Exception):
        d.delay_ms = 1  # frozen


@pytest.mark.parametrize("source", [
    "critical",
    b"critical",
    "max_attempts: 3\nmax_elapsed: 10s\nbackoff: {strategy: exponential, base: 100ms, multiplier: 2, cap: 2s}\n"
    "jitter: {mode: full}\nretry_after: {cap: 5s, on_exceed: give_up}\n",
    {"extends": "critical"},
])
def test_load_policy_sources(source):
    p = backstop.load_policy(source)
    assert p.decide(attempt=1, http_status=503, random=0.5, now_ms=0).delay_ms == 50
    assert p.decide(attempt=3, http_status=503, random=0.5, now_ms=0).reason == "max_attempts_reached"


def test_load_policy_path(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("extends: critical\nmax_attempts: 4\n")
    assert backstop.load_policy(f).decide(attempt=3, http_status=503, random=0, now_ms=0).action == "retry"


def test_bad_policy_names_the_field(tmp_path):
    with pytest.raises(PolicyError) as e:
        backstop.load_policy({"backoff": {"base": "1s", "cap": "100ms"}})
    assert e.value.field == "backoff.cap" and "backoff.cap" in str(e.value)
    with pytest.raises(PolicyError) as e:
        backstop.load_policy("backoff:\n  colour: red\n")
    assert "backoff.colour" in str(e.value)
    with pytest.raises(TypeError):
        backstop.load_policy(42)
    assert issubclass(PolicyError, BackstopError) and issubclass(InputError, BackstopError)


def test_input_errors():
    p = backstop.load_policy("default")
    with pytest.raises(InputError, match=r"^attempt: must be >= 1 \(got 0\)$") as e:
        p.decide(http_status=503)
    assert (e.value.field, e.value.reason) == ("attempt", "must be >= 1 (got 0)")
    with pytest.raises(InputError, match="^colour: unknown field"):
        p.decide(attempt=1, colour="red")
    with pytest.raises(InputError, match='^grpc_code: unknown gRPC status name "NOPE"'):
        p.decide(attempt=1, grpc_code="NOPE")
    with pytest.raises(InputError, match="^attempt: must be an integer"):
        p.decide(attempt="one")
    # The times of record_success and circuit_state follow now_ms's rules.
    q = backstop.load_policy({"circuit_breaker": {"failure_threshold": 2, "open_for": "1s", "half_open_successes": 1}})
    for now, message in ((1e300, "now_ms: must fit in 64 bits (got 1e+300)"),
                         (2 ** 64, "now_ms: must fit in 64 bits (got 18446744073709551616)"),
                         (True, "now_ms: must be an integer (got true)")):
        with pytest.raises(InputError) as e:
            q.record_success(now)
        assert str(e.value) == message
        with pytest.raises(InputError) as e:
            q.circuit_state(now)
        assert str(e.value) == message


def test_acquire_half_open_admits_max_calls():
    p = backstop.load_policy({"circuit_breaker": {"failure_threshold": 1, "open_for": "1s", "half_open_max_calls": 2}})
    t0 = 1_767_225_600_000
    assert p.acquire(t0) == backstop.Permit(allowed=True, retry_in_ms=0, state="closed")
    p.decide(attempt=1, http_status=503, now_ms=t0, random=0.5)
    refused = p.acquire(t0 + 1)
    assert refused == backstop.Permit(False, 999, "open") and refused.retry_in == timedelta(milliseconds=999)
    assert [p.acquire(t0 + 1000 + i).allowed for i in range(4)] == [True, True, False, False]
    p.record_success(t0 + 1010)
    assert p.acquire(t0 + 1011) == backstop.Permit(True, 0, "closed")
    assert p.on_open == "defer"
    p.close()
    with pytest.raises(BackstopError, match="closed"):
        p.acquire(t0)


def test_budget_tokens():
    """budget_tokens reads the budget without changing it; None without one."""
    t0 = 1_767_225_600_000
    with backstop.load_policy({"retry_budget": {"max_tokens": 10, "token_ratio": 0.5}}) as p:
        assert p.budget_tokens(t0) == 10
        p.decide(attempt=1, http_status=503, now_ms=t0, random=0.5)
        assert p.budget_tokens(t0) == p.budget_tokens(t0) == 9
        p.record_success(t0 + 1)
        assert p.budget_tokens(t0 + 1) == 9.5
        with pytest.raises(InputError, match=r"^now_ms: must be >= 0"):
            p.budget_tokens(-1)
    assert backstop.load_policy({"circuit_breaker": {}}).budget_tokens(t0) is None
    assert backstop.load_policy("default").budget_tokens() is None


@pytest.mark.parametrize("fast", [True, False])
def test_attempt_timeout(fast):
    """attempt_timeout: the policy's, bounded by what is left of
    max_elapsed, at least 1 ms; 0 for none; bad input is an InputError."""
    from backstop._policy import load_into

    inst = Instance(fast=fast)
    with load_into(inst, b'{"attempt_timeout": "2s", "max_elapsed": "5s"}') as p:
        assert p.attempt_timeout(0) == p.attempt_timeout() == 2000
        assert p.attempt_timeout(4000) == p.attempt_timeout(timedelta(seconds=4)) == p.attempt_timeout(4000.9) == 1000
        assert p.attempt_timeout(5000) == p.attempt_timeout(9000) == 1
        with pytest.raises(InputError, match=r"^elapsed_ms: must be >= 0 \(got -5\)$") as e:
            p.attempt_timeout(-5)
        assert e.value.field == "elapsed_ms"
        for bad in ("1", [], True, float("nan")):
            with pytest.raises(InputError, match=r"^elapsed_ms: must be an integer"):
                p.attempt_timeout(bad)
    with load_into(inst, b'{"max_elapsed": "5s"}') as p:
        assert p.attempt_timeout(1500) == 3500
    with load_into(inst, b'{"max_elapsed": "5s", "stop_when": "all"}') as p:
        assert p.attempt_timeout(1500) == 0
    with load_into(inst, b'{}') as p:
        assert p.attempt_timeout(10**9) == 0
    p = load_into(inst, b'{"attempt_timeout": "1s"}')
    p.close()
    with pytest.raises(BackstopError, match="closed"):
        p.attempt_timeout(0)
    with pytest.raises(PolicyError, match="attempt_timeout"):
        backstop.load_policy({"attempt_timeout": "-1s"})


def test_acquire_now_ms():
    """now_ms defaults to the host's clock; 0 on a stateful policy, or a
    negative one, is an InputError naming now_ms, and changes nothing."""
    st = backstop.load_policy({"circuit_breaker": {}, "on_open": "dead_letter"})
    sl = backstop.load_policy("default")
    assert st.on_open == "dead_letter"
    assert st.acquire() == backstop.Permit(True, 0, "closed")
    assert sl.acquire(0) == backstop.Permit(True, 0, "closed")
    with pytest.raises(InputError, match=r"^now_ms: must be set") as e:
        st.acquire(0)
    assert e.value.field == "now_ms"
    with pytest.raises(InputError, match=r"^now_ms: must be >= 0 \(got -1\)$"):
        sl.acquire(-1)
    with pytest.raises(InputError, match=r"^now_ms: must be an integer"):
        st.acquire("soon")


def test_field_types():
    p = backstop.load_policy(NO_JITTER)

    class StatusCode(Enum):  # like grpc.StatusCode
        UNAVAILABLE = (14, "unavailable")

    base = p.decide(attempt=2, grpc_code=14, now_ms=0)
    assert base.delay_ms == 200
    for code in ("UNAVAILABLE", "unavailable", StatusCode.UNAVAILABLE):
        assert p.decide(attempt=2, grpc_code=code, now_ms=0) == base
    hint = p.decide(attempt=1, http_status=429, retry_after="3", now_ms=0)
    assert hint.delay_ms == 3000
    for ra in (3, 2.5, timedelta(seconds=3), b"3"):
        assert p.decide(attempt=1, http_status=429, retry_after=ra, now_ms=0) == hint
    assert p.decide(attempt=1, grpc_code=14, grpc_retry_pushback_ms=700, now_ms=0).delay_ms == 700
    short = {"max_elapsed": "1s"}
    q = backstop.load_policy({**NO_JITTER, **short})
    for elapsed in (950, 950.7, timedelta(milliseconds=950)):
        assert q.decide(attempt=1, http_status=503, elapsed_ms=elapsed, now_ms=0).reason == "max_elapsed_exceeded"
    # None means absent; integers past 64 bits are refused, never saturated
    # or wrapped; a bool is no number.
    assert p.decide(attempt=1, http_status=None, grpc_code=None, method=None, now_ms=0).klass == "uncertain"
    with pytest.raises(InputError, match=r"^attempt: must fit in 64 bits \(got 1180591620717411303424\)$"):
        p.decide(attempt=2 ** 70, http_status=503, now_ms=0)
    with pytest.raises(InputError, match=r"^attempt: must fit in 64 bits \(got -1180591620717411303424\)$"):
        p.decide(attempt=-(2 ** 70))
    with pytest.raises(InputError, match=r"^http_status: must be a 32-bit integer \(got true\)$"):
        p.decide(attempt=1, http_status=True)
    # The issue's cases: a huge random is +Infinity (clamped), a lone
    # surrogate is U+FFFD, a key must be a string or a boolean.
    assert p.decide(attempt=1, http_status=503, random=10 ** 400, now_ms=0) == p.decide(attempt=1, http_status=503, random=1.0, now_ms=0)
    assert p.decide(attempt=1, http_status=503, method="GET\ud800", now_ms=0) == p.decide(attempt=1, http_status=503, method="GET\ufffd", now_ms=0)
    with pytest.raises(InputError, match=r"^idempotency_key: must be a string or a boolean \(got 0\)$"):
        p.decide(attempt=1, idempotency_key=0)


def test_python_values_keep_their_meaning():
    """Python's own types the fast path leaves to the core: mapped to what
    they mean first, or described by their type's name."""
    from collections import deque
    from enum import IntEnum

    class Status(IntEnum):
        UNAVAILABLE = 503

    class Index:  # an integer-like object (numpy's integers)
        def __index__(self):
            return 2

    p = backstop.load_policy(NO_JITTER)
    base = p.decide(attempt=2, http_status=503, now_ms=0)
    assert p.decide(attempt=Index(), http_status=Status.UNAVAILABLE, now_ms=0) == base
    assert p.decide(attempt=2, http_status=503, now_ms=0, method=bytearray(b"GET")) == \
        p.decide(attempt=2, http_status=503, now_ms=0, method=memoryview(b"GET")) == p.decide(attempt=2, http_status=503, now_ms=0, method="GET")
    for fields, message in (
            ({"attempt": 1, "method": Index()}, "method: must be a string (got a Index)"),
            ({"attempt": 1, "method": Status.UNAVAILABLE}, "method: must be a string (got 503)"),
            ({"attempt": timedelta(seconds=1)}, "attempt: must be an integer (got a timedelta)"),
            ({"attempt": 1, "grpc_retry_pushback_ms": timedelta(seconds=1)}, "grpc_retry_pushback_ms: must be a string or a number (got a timedelta)"),
            ({"attempt": 1, "error_kind": deque()}, "error_kind: must be a string (got a deque)"),
            ({"attempt": 1, "error_kind": ("timeout",)}, "error_kind: must be a string (got an array)"),
            ({"attempt": 1, "error_kind": {"kind": "timeout"}}, "error_kind: must be a string (got an object)"),
            ({"attempt": 1, "random": float("nan"), "http_status": 1.5}, "http_status: must be a 32-bit integer (got 1.5)"),
            ({"attempt": 10 ** 5000}, "attempt: must fit in 64 bits (got 1%s)" % ("0" * 5000)),
            ({"attempt": 1, "a: b": 1}, "a: b: unknown field"),
            ({"attempt": 1, "\udfff": 1, "\ud800": 2, 7: 1, "7": 1}, "7: unknown field"),
            ({"attempt": 1, "\udfff": 1, "\ud800": 2}, "\ufffd: unknown field")):
        with pytest.raises(InputError) as e:
            p.decide(fields)
        assert str(e.value) == message
        with pytest.raises(InputError) as e:
            p.decide_many([{"attempt": 1}, fields])
        assert str(e.value) == "failures[1]: " + message and e.value.decisions[0] is not None
    with pytest.raises(InputError) as e:
        p.decide({"attempt": 1, "a: b": 1})
    assert (e.value.field, e.value.reason) == ("a: b", "unknown field")
    for failure in (deque(), "attempt", [("attempt", 1)]):
        with pytest.raises(InputError, match=r"^failure: must be an object \(got a"):
            p.decide(failure)
    # A closed policy: a bad failure is refused for what it is, first.
    p.close()
    with pytest.raises(InputError, match="^attempt: must be an integer"):
        p.decide(attempt="x")
    with pytest.raises(InputError, match="^colour: unknown field"):
        p.decide(attempt=1, colour="red")
    with pytest.raises(BackstopError, match="closed"):
        p.decide(attempt=1, elapsed_ms=timedelta(seconds=1))


def test_defaults_draw_random_and_read_the_clock():
    p = backstop.load_policy("default")
    delays = {p.decide(attempt=4, http_status=503).delay_ms for _ in range(50)}
    assert len(delays) > 1 and all(0 <= d <= 8000 for d in delays)
    q = backstop.load_policy(NO_JITTER)
    # An HTTP-date in the past means no wait: only the computed delay.
    assert q.decide(attempt=1, http_status=503, retry_after="Wed, 21 Oct 2015 07:28:00 GMT").delay_ms == 100


def test_decide_many_matches_decide_and_handles_long_strings():
    p = backstop.load_policy(NO_JITTER)
    fs = [{"attempt": a % 7 + 1, "http_status": s, "method": m, "retry_after": ra, "now_ms": 0, "random": 0.25}
          for a, (s, m, ra) in enumerate([(503, "GET", ""), (429, "POST", "2"), (500, "PUT", "x" * 65535)] * 1500)]
    fs.insert(3, {"attempt": 1, "grpc_code": "UNAVAILABLE", "elapsed_ms": 1.5, "random": "NaN", "now_ms": 0})
    assert p.decide_many(fs) == [p.decide(f) for f in fs]
    assert p.decide_many(iter([])) == []


def test_decide_many_reports_the_first_invalid_failure():
    p = backstop.load_policy(NO_JITTER)
    with pytest.raises(InputError) as e:
        p.decide_many([{"attempt": 1, "now_ms": 0}, {"attempt": 1, "grpc_code": "NOPE"}, {"attempt": 0}])
    assert str(e.value) == 'failures[1]: grpc_code: unknown gRPC status name "NOPE"' and e.value.index == 1
    assert e.value.decisions[0].klass == "uncertain" and e.value.decisions[1:] == [None, None]


def test_stateful_policy_and_close():
    p = backstop.load_policy({"circuit_breaker": {"failure_threshold": 2, "open_for": "30s"}})
    assert p.stateful and p.circuit_state(0) == "closed"
    for _ in range(2):
        p.decide(attempt=1, http_status=503, now_ms=1000, random=0)
    assert p.circuit_state(1000) == "open" and p.circuit_state(31000) == "half_open"
    assert p.decide(attempt=1, http_status=503, now_ms=2000).reason == "circuit_open"
    p.record_success(31000)
    assert p.circuit_state(31000) == "closed"
    # Two policies from one source never share state.
    assert backstop.load_policy({"circuit_breaker": {"failure_threshold": 2, "open_for": "30s"}}).circuit_state(1000) == "closed"
    assert not backstop.load_policy("default").stateful
    with p:
        pass
    with pytest.raises(BackstopError, match="closed"):
        p.decide(attempt=1)
    p.close()  # twice is fine


def test_threads_share_a_policy():
    p = backstop.load_policy(NO_JITTER)
    want = [p.decide(attempt=a, http_status=503, now_ms=0).delay_ms for a in range(1, 6)]
    errors = []

    def work(i):
        try:
            for _ in range(300):
                if i % 2:
                    got = [p.decide(attempt=a, http_status=503, now_ms=0).delay_ms for a in range(1, 6)]
                else:
                    got = [d.delay_ms for d in p.decide_many([{"attempt": a, "http_status": 503, "now_ms": 0} for a in range(1, 6)])]
                assert got == want
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_unknown_abi_version_is_refused():
    wasm = wasmtime.wat2wasm('(module (memory (export "memory") 1) (func (export "abi_version") (result i32) i32.const 2))')
    with pytest.raises(BackstopError, match=r"ABI version 2 is not supported by this host \(want 1\)"):
        Instance(wasm, cache_dir=None)


def test_missing_export_is_refused():
    wasm = wasmtime.wat2wasm('(module (memory (export "memory") 1) (func (export "abi_version") (result i32) i32.const 1))')
    with pytest.raises(BackstopError, match="buffer is not exported"):
        Instance(wasm, cache_dir=None)


def test_compile_cache(tmp_path, monkeypatch):
    wasm = wasmtime.wat2wasm('(module (func (export "f") (result i32) i32.const 7))')
    engine = wasmtime.Engine()
    cache = tmp_path / "cache"
    load_module(engine, wasm, cache)
    (cached,) = cache.glob("*.cwasm")  # beside it, backstop-KEY.json: what it was compiled from and for
    compiled = []
    real = wasmtime.Module
    monkeypatch.setattr(wasmtime, "Module", type("Counting", (real,), {
        "__init__": lambda self, e, w: (compiled.append(1), real.__init__(self, e, w))[1]}))
    load_module(engine, wasm, cache)
    assert compiled == []  # served from the cache
    cached.write_bytes(b"garbage")
    stale = cache / "backstop-0123.cwasm"
    stale.write_bytes(b"an old version")
    os.utime(stale, (0, 0))
    load_module(engine, wasm, cache)
    assert compiled == [1]  # recompiled and rewritten
    assert sorted(cache.iterdir()) == [cached, cached.with_suffix(".json")]  # entries unused for a week are dropped
    os.chmod(cache, 0o777)  # a directory others can write to is not trusted
    load_module(engine, wasm, cache)
    assert compiled == [1, 1]
    load_module(engine, wasm, None)
    assert compiled == [1, 1, 1]


# A stand-in module with the whole ABI whose decide traps.
TRAPPING = """(module
  (memory (export "memory") 1)
  (func (export "_initialize"))
  (func (export "abi_version") (result i32) i32.const 1)
  (func (export "buffer") (param i32) (result i32) i32.const 1024)
  (func (export "policy_load") (param i32) (result i32) i32.const 1)
  (func (export "policy_preset") (param i32) (result i32) i32.const 1)
  (func (export "policy_free") (param i32) (result i32) i32.const 0)
  (func (export "policy_stateful") (param i32) (result i32) i32.const 0)
  (func (export "decide") (param i32 i64 i32 i32 i64 i64 f64 i64 i32 i32 i32 i32) (result i64) unreachable)
  (func (export "decide_batch") (param i32 i32 i32 i32) (result i32) i32.const 0)
  (func (export "record_success") (param i32 i64) (result i32) i32.const 0)
  (func (export "record_duration") (param i32 i64 i64) (result i32) i32.const 0)
  (func (export "circuit_state") (param i32 i64) (result i32) i32.const 0)
  (func (export "acquire") (param i32 i64) (result i64) i64.const 0)
  (func (export "policy_on_open") (param i32) (result i32) i32.const 0)
  (func (export "policy_lints") (param i32) (result i64) i64.const 0)
  (func (export "budget_tokens") (param i32 i64) (result i64) i64.const 0)
  (func (export "attempt_timeout") (param i32 i64) (result i64) i64.const 0)
  (func (export "connect_timeout") (param i32) (result i64) i64.const 0)
  (func (export "outcome") (param i32 i32 i64 i32 i32 i64 i64 f64 i64 i32 i32 i32 i32 i64 i64) (result i64) i64.const 0)
  (func (export "decide_value") (param i32 i32) (result i64) i64.const 0)
  (func (export "outcome_value") (param i32 i32 i32 i64 i64) (result i64) i64.const 0)
  (func (export "error_message") (result i64) i64.const 0))"""


@pytest.mark.parametrize("fast", [True, False])
def test_a_trap_retires_the_instance(fast):
    from backstop._policy import load_into

    p = load_into(Instance(wasmtime.wat2wasm(TRAPPING), cache_dir=None, fast=fast), "default")
    with pytest.raises(BackstopError, match=r"decide trapped \(the instance was replaced by a fresh one\)") as e:
        p.decide(attempt=1)
    assert isinstance(e.value.__cause__, wasmtime.Trap)
    with pytest.raises(BackstopError, match="decide trapped"):
        p.decide(attempt=1)  # the stateless policy went to the fresh instance, which traps too


def test_an_oversized_policy_is_a_policy_error_at_any_size(tmp_path):
    """Policies are cut one byte past the module's limit
    (policy.MaxFileBytes) before they are copied in: any oversized input
    gets the module's own PolicyError, never a buffer error."""
    from backstop._policy import MAX_POLICY_BYTES

    fits = b"{}" + b" " * (MAX_POLICY_BYTES - 2)
    backstop.load_policy(fits).close()
    huge = tmp_path / "huge.json"
    huge.write_bytes(b"{}" + b" " * (65 << 20))
    for source in (fits + b" ", b"{}" + b" " * (65 << 20), huge):
        with pytest.raises(PolicyError, match="must be at most 65536 bytes"):
            backstop.load_policy(source)
