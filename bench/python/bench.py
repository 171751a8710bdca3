"""Side-by-side benchmarks of backstop's Python host against tenacity,
backoff and stamina. Prints markdown tables.

    .venv/bin/pip install -e 'sdk/python[test]' -r bench/python/requirements.txt
    .venv/bin/python bench/python/bench.py [--quick]

Every library runs the same policy: exponential backoff from 1 s, doubling,
capped at 300 s, full jitter, 5 attempts, retrying on connection errors
(backstop's "default" preset). backstop decides more per failure (HTTP
status and gRPC classification, Retry-After, the idempotency gate, elapsed
limits) in WebAssembly; the others compute a delay and count attempts in
Python.

1. Per-attempt decision: the work a library does between catching a
   failure and sleeping. tenacity: ``Retrying.iter(retry_state)`` on a
   RetryCallState holding the exception (the retry predicate, the wait and
   stop strategies and tenacity's action chain), and the three strategies
   alone. backoff: the bookkeeping of ``backoff._sync.retry_exception``
   for one failure (elapsed, details, max_tries, giveup) and the wait
   generator step with full jitter. stamina: ``Retrying.iter`` with the
   strategies stamina gives tenacity (built as stamina's own
   ``retry_context`` does).
2. The decorated retry loop, per failed attempt, with sleeping stubbed
   out (stamina's retry hooks switched off: by default it logs each retry).
3. Start-up: ``import backstop`` + ``load_policy("default")`` in a fresh
   process, cold (empty compile cache) and warm.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from typing import Callable, List, Tuple

import backoff
import stamina
import tenacity
from backoff import _common as backoff_common

import backstop

QUICK = "--quick" in sys.argv


def per_op(fn: Callable[[int], None], n: int, repeat: int = 5) -> float:
    """Best seconds per operation over repeat runs of fn(n)."""
    fn(max(1, n // 10))  # warm up
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn(n)
        best = min(best, (time.perf_counter() - t) / n)
    return best


# -- 1. per-attempt decision --------------------------------------------------

POLICY = backstop.load_policy("default")


def bs_decide(n: int) -> None:
    decide = POLICY.decide
    for i in range(n):
        decide(attempt=i % 4 + 1, error_kind="connection_reset")


def bs_decide_http(n: int) -> None:
    decide = POLICY.decide
    f = {"attempt": 2, "http_status": 503, "retry_after": "3", "method": "GET"}
    for i in range(n):
        decide(f)


FAILURES = [{"attempt": i % 4 + 1, "http_status": (503, 500, 429, 502)[i % 4], "random": random.random(),
             "now_ms": 1767225600000} for i in range(10_000)]


def bs_decide_many(n: int) -> None:
    for _ in range(n // len(FAILURES)):
        POLICY.decide_many(FAILURES)


EXC = ConnectionResetError("reset")
TENACITY = tenacity.Retrying(
    wait=tenacity.wait_random_exponential(multiplier=1, max=300),
    stop=tenacity.stop_after_attempt(5),
    retry=tenacity.retry_if_exception_type(ConnectionError),
)


def tenacity_iter(n: int) -> None:
    r, rs = TENACITY, tenacity.RetryCallState(TENACITY, None, (), {})
    r.begin()  # as Retrying.__call__ does: resets the statistics
    exc_info = (type(EXC), EXC, None)
    for i in range(n):
        rs.attempt_number = i % 4 + 1
        rs.set_exception(exc_info)
        action = r.iter(rs)
        assert isinstance(action, tenacity.DoSleep)


def tenacity_strategies(n: int) -> None:
    r, rs = TENACITY, tenacity.RetryCallState(TENACITY, None, (), {})
    rs.set_exception((type(EXC), EXC, None))
    retry, wait, stop = r.retry, r.wait, r.stop
    for i in range(n):
        rs.attempt_number = i % 4 + 1
        if retry(rs) and not stop(rs):
            wait(rs)


def backoff_step(n: int) -> None:
    # One failure of backoff._sync.retry_exception, minus the call and sleep.
    max_tries, max_time, giveup = 5, None, lambda e: False
    start = datetime.datetime.now()
    wait = backoff_common._init_wait_gen(backoff.expo, {"factor": 1, "max_value": 300})
    for i in range(n):
        tries = i % 4 + 1
        elapsed = datetime.timedelta.total_seconds(datetime.datetime.now() - start)
        details = {"target": None, "args": (), "kwargs": {}, "tries": tries, "elapsed": elapsed}
        if giveup(EXC) or tries == max_tries or (max_time is not None and elapsed >= max_time):
            raise AssertionError
        backoff_common._next_wait(wait, EXC, backoff.full_jitter, elapsed, max_time)
        if tries == 4:  # a new call starts a new generator, as backoff does
            wait = backoff_common._init_wait_gen(backoff.expo, {"factor": 1, "max_value": 300})
    del details


def backoff_generator(n: int) -> None:
    wait = backoff_common._init_wait_gen(backoff.expo, {"factor": 1, "max_value": 300})
    jitter, send = backoff.full_jitter, wait.send
    for _ in range(n):
        jitter(send(None))


stamina.instrumentation.set_on_retry_hooks([])
STAMINA_CTX = stamina.retry_context(on=ConnectionError, attempts=5, timeout=None, wait_initial=1.0,
                                    wait_max=300.0, wait_jitter=1.0, wait_exp_base=2)
STAMINA = tenacity.Retrying(before=STAMINA_CTX._exit_cms, **STAMINA_CTX._t_kw)


def stamina_iter(n: int) -> None:
    r, rs = STAMINA, tenacity.RetryCallState(STAMINA, None, (), {})
    r.begin()
    exc_info = (type(EXC), EXC, None)
    for i in range(n):
        rs.attempt_number = i % 4 + 1
        rs.set_exception(exc_info)
        action = r.iter(rs)
        assert isinstance(action, tenacity.DoSleep)


# -- 2. the decorated loop ----------------------------------------------------

ATTEMPTS = 5


def failing() -> None:
    raise EXC


def loop(decorated: Callable[[], None], catch: Tuple[type, ...]) -> Callable[[int], None]:
    def run(n: int) -> None:
        for _ in range(n // ATTEMPTS):
            try:
                decorated()
            except catch:
                pass
    return run


def loops() -> List[Tuple[str, Callable[[int], None]]]:
    import backstop._retry as bs_retry

    bs_retry._sleep = lambda s: None
    t = tenacity.retry(wait=tenacity.wait_random_exponential(multiplier=1, max=300),
                       stop=tenacity.stop_after_attempt(ATTEMPTS),
                       retry=tenacity.retry_if_exception_type(ConnectionError),
                       sleep=lambda s: None, reraise=True)(failing)
    b = backoff.on_exception(backoff.expo, ConnectionError, max_tries=ATTEMPTS, max_value=300,
                             jitter=backoff.full_jitter)(failing)
    s = stamina.retry(on=ConnectionError, attempts=ATTEMPTS, timeout=None, wait_initial=1.0,
                      wait_max=300.0, wait_jitter=1.0)(failing)
    return [
        ("backstop `@policy.retry`", loop(POLICY.retry(failing), (backstop.RetryError,))),
        ("tenacity `@retry`", loop(t, (ConnectionError,))),
        ("backoff `@on_exception`", loop(b, (ConnectionError,))),
        ("stamina `@retry` (hooks off)", loop(s, (ConnectionError,))),
    ]


# -- 3. start-up ---------------------------------------------------------------

STARTUP = """
import time
t = time.perf_counter()
import backstop
backstop.load_policy("default").decide(attempt=1, http_status=503)
print(time.perf_counter() - t)
"""


# The same, with the engine Instance used before issue 14 (Cranelift, its
# default): what Winch saves on a cold start.
STARTUP_CRANELIFT = STARTUP.replace("import backstop\n", """from backstop import _runtime
_runtime._ENGINE_SETTINGS = (("memory_may_move", False),)
import backstop
""")


def startup(cache_dir: str, runs: int, code: str = STARTUP) -> Tuple[float, float]:
    """Median in-process seconds (import + load + first decision) and median
    process wall time."""
    inner, wall = [], []
    env = dict(os.environ, BACKSTOP_CACHE_DIR=cache_dir)
    for _ in range(runs):
        t = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        wall.append(time.perf_counter() - t)
        inner.append(float(out.stdout))
    return statistics.median(inner), statistics.median(wall)


def table(title: str, rows: List[Tuple[str, float]], base: str) -> None:
    ref = dict(rows)[base]
    print("\n### %s\n" % title)
    print("| | per attempt | attempts/s | time vs %s |" % base)
    print("|---|---:|---:|---:|")
    for name, s in rows:
        print("| %s | %s | %s | %.2f× |" % (name, fmt_time(s), "{:,.0f}".format(1 / s), s / ref))


def fmt_time(s: float) -> str:
    return "%.0f ns" % (s * 1e9) if s < 1e-6 else "%.2f µs" % (s * 1e6)


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).add_argument("--quick", action="store_true")
    n = 20_000 if QUICK else 200_000
    print("## backstop Python host benchmarks\n")
    print("Python %s, %s; wasmtime %s, tenacity %s, backoff %s, stamina %s." % (
        platform.python_version(), platform.machine(), version("wasmtime"), version("tenacity"),
        version("backoff"), version("stamina")))
    print("Best of 5 runs; per failed attempt; lower is better.")

    rows = [
        ("backstop `decide(attempt=…, error_kind=…)`", per_op(bs_decide, n)),
        ("backstop `decide({… http_status, retry_after, method})`", per_op(bs_decide_http, n)),
        ("backstop `decide_many` (10,000 a call)", per_op(bs_decide_many, max(n, 100_000) * 2)),
        ("tenacity `Retrying.iter` (retry + wait + stop + actions)", per_op(tenacity_iter, n)),
        ("tenacity strategies alone (retry, stop, wait)", per_op(tenacity_strategies, n)),
        ("backoff per failure (bookkeeping + generator + jitter)", per_op(backoff_step, n)),
        ("backoff generator step + jitter alone", per_op(backoff_generator, n)),
        ("stamina (`Retrying.iter` with stamina's strategies)", per_op(stamina_iter, n)),
    ]
    table("1. Deciding one failed attempt", rows, "tenacity `Retrying.iter` (retry + wait + stop + actions)")

    real_sleep = time.sleep
    time.sleep = lambda s: None  # backoff and stamina (through tenacity) call time.sleep
    try:
        rows = [(name, per_op(fn, n // 2)) for name, fn in loops()]
    finally:
        time.sleep = real_sleep
    table("2. Decorated retry loop, per failed attempt (sleep stubbed out)", rows, "tenacity `@retry`")

    runs = 3 if QUICK else 7
    with tempfile.TemporaryDirectory() as tmp:
        # Cold runs alternate between the engines: a machine that slows
        # down mid-run slows both.
        pairs = [(startup(os.path.join(tmp, "cold%d" % i), 1), startup(os.path.join(tmp, "cranelift%d" % i), 1, STARTUP_CRANELIFT))
                 for i in range(runs)]
        cold, cranelift = [p[0] for p in pairs], [p[1] for p in pairs]
        warm = startup(os.path.join(tmp, "cold0"), runs)
    print("\n### 3. Start-up: `import backstop` + `load_policy(\"default\")` + first decision\n")
    print("| | in process (median) | whole process (median) |")
    print("|---|---:|---:|")
    print("| cold (empty compile cache: compiles backstop.wasm) | %.0f ms | %.0f ms |" % (
        statistics.median(c[0] for c in cold) * 1e3, statistics.median(c[1] for c in cold) * 1e3))
    print("| cold, Cranelift (the engine before issue 14) | %.0f ms | %.0f ms |" % (
        statistics.median(c[0] for c in cranelift) * 1e3, statistics.median(c[1] for c in cranelift) * 1e3))
    print("| warm (compiled module from the cache) | %.0f ms | %.0f ms |" % (warm[0] * 1e3, warm[1] * 1e3))


if __name__ == "__main__":
    main()
