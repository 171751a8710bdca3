"""Per-decision cost of two versions of the Python host, paired in one
process: decide(keywords), decide(dict), decide_many, and two failures
the fast path leaves to the slow one (a valid timedelta, an invalid
http_status), CPU time per call.

    git worktree add /tmp/py-before 1c562f0   # or any commit
    make wasm && cp contract/backstop.wasm contract/errorkinds.json /tmp/py-before/sdk/python/src/backstop/
    .venv/bin/python bench/python/paired.py /tmp/py-before/sdk/python/src/backstop sdk/python/src/backstop

Both packages are imported under other names (backstop_old, backstop_new:
their imports are relative) and load their own copy of backstop.wasm (copy
the same one into both to compare the Python code alone). Each repeat runs
a batch of calls of old then new (the order alternating), so both see the
same load on a shared machine: read the median of the paired ratios.
REPEATS (default 41) sets the repeats.
"""

from __future__ import annotations

import importlib
import os
import random
import statistics
import sys
import tempfile
import time
from datetime import timedelta

F = {"attempt": 2, "http_status": 503, "retry_after": "3", "method": "GET"}
FS = [{"attempt": i % 4 + 1, "http_status": (503, 500, 429, 502)[i % 4], "random": random.random(),
       "now_ms": 1767225600000} for i in range(10_000)]


def kw(p, n):
    decide = p.decide
    for i in range(n):
        decide(attempt=i % 4 + 1, error_kind="connection_reset")


def dct(p, n):
    decide = p.decide
    for _ in range(n):
        decide(F)


def unusual(p, n):
    decide, elapsed = p.decide, timedelta(seconds=3)
    for _ in range(n):
        decide(attempt=2, http_status=503, elapsed_ms=elapsed)


def invalid(p, n):
    decide = p.decide
    for _ in range(n):
        try:
            decide(attempt=2, http_status="503")
        except ValueError:  # InputError
            pass


def many(p, n):
    for _ in range(n // len(FS)):
        p.decide_many(FS)


def main() -> None:
    old, new = sys.argv[1:3]
    links = tempfile.mkdtemp()
    for name, path in (("backstop_old", old), ("backstop_new", new)):
        os.symlink(os.path.abspath(path), os.path.join(links, name))
    sys.path.insert(0, links)
    policies = {k: importlib.import_module("backstop_" + k).load_policy("default") for k in ("old", "new")}
    repeats = int(os.environ.get("REPEATS", "41"))
    print("| | old best / median | new best / median | new ÷ old, best | median of %d paired ratios |" % repeats)
    print("|---|---:|---:|---:|---:|")
    for name, fn, n in (("decide(kw)", kw, 4000), ("decide(dict)", dct, 4000), ("decide_many, per failure", many, 20000),
                       ("decide(timedelta), slow path", unusual, 2000), ("decide(invalid), InputError", invalid, 2000)):
        for p in policies.values():
            fn(p, n)  # warm
        t: dict = {"old": [], "new": []}
        for r in range(repeats):
            for k in ("old", "new") if r % 2 == 0 else ("new", "old"):
                s = time.process_time()
                fn(policies[k], n)
                t[k].append((time.process_time() - s) / n * 1e6)
        ratios = [b / a for a, b in zip(t["old"], t["new"])]
        print("| %s | %.3f / %.3f µs | %.3f / %.3f µs | %.3f | %.3f |" % (
            name, min(t["old"]), statistics.median(t["old"]), min(t["new"]), statistics.median(t["new"]),
            min(t["new"]) / min(t["old"]), statistics.median(ratios)))


if __name__ == "__main__":
    main()
