"""Per-decision cost of the backstop on PYTHONPATH, for paired runs of two
trees in alternating processes (bench/paired.sh):

    PYTHONPATH=TREE/sdk/python/src .venv/bin/python bench/issue41_python.py

Prints one line: backstop.__file__ and the median ns per call of each
workload (bench/python/bench.py's) over 7 repeats, by the process's CPU time
(what a shared, loaded machine disturbs least) and by wall time (_wall).
"""

import statistics
import time

import backstop

POLICY = backstop.load_policy("default")
N = 20_000


def decide_kwargs(n):
    decide = POLICY.decide
    for i in range(n):
        decide(attempt=i % 4 + 1, error_kind="connection_reset")


def decide_dict(n):
    decide = POLICY.decide
    f = {"attempt": 2, "http_status": 503, "retry_after": "3", "method": "GET"}
    for _ in range(n):
        decide(f)


FAILURES = [{"attempt": i % 4 + 1, "http_status": (503, 500, 429, 502)[i % 4], "random": (i % 97) / 97,
             "now_ms": 1767225600000} for i in range(10_000)]


def decide_many(n):
    for _ in range(n // len(FAILURES)):
        POLICY.decide_many(FAILURES)


def per_op(fn, n, repeat=7):
    fn(n // 10)
    cpu, wall = [], []
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        fn(n)
        cpu.append((time.process_time() - c) / n * 1e9)
        wall.append((time.perf_counter() - t) / n * 1e9)
    return statistics.median(cpu), statistics.median(wall)


res = {name: per_op(fn, n) for name, fn, n in (
    ("kwargs", decide_kwargs, N), ("dict", decide_dict, N), ("many", decide_many, 5 * 10_000))}
print(backstop.__file__, " ".join("%s=%.0f %s_wall=%.0f" % (k, c, k, w) for k, (c, w) in res.items()))
