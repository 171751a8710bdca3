"""testdata/vectors/inputs.json: bad (and odd) inputs, and the answer every
backstop host gives, byte for byte: through decide, decide_many and
``python -m backstop decide``."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import backstop
from backstop.__main__ import _line

INPUTS = Path(__file__).resolve().parents[3] / "testdata" / "vectors" / "inputs.json"
FILE = json.loads(INPUTS.read_text())


def revive(v):
    """The library-only values a line cannot hold: {"$bytes": hex},
    {"$float": "NaN"}, {"$int": digits}."""
    if isinstance(v, list):
        return [revive(x) for x in v]
    if not isinstance(v, dict):
        return v
    if list(v) == ["$bytes"]:
        return bytes.fromhex(v["$bytes"])
    if list(v) == ["$float"]:
        return float(v["$float"])
    if list(v) == ["$int"]:
        return int(v["$int"])
    return {k: revive(x) for k, x in v.items()}


def failure(v):
    """A failure as the command decides it: absent (or None) random and
    now_ms are 0, not a draw and the clock."""
    if isinstance(v, dict):
        v = dict(v)
        for name in ("random", "now_ms"):
            if v.get(name) is None:
                v[name] = 0
    return v


def answer(d=None, error=None):
    return _line({"error": error} if error is not None else d.to_dict()).decode().rstrip("\n")


# The library cases: every value, and every line that holds a value (not a
# line-level error) and is not for the commands only.
CASES = [c for c in FILE["cases"] if "value" in c or ("line" in c and not c.get("cli")
                                                       and not c["output"].startswith('{"error":"invalid input line: '))]
IDS = ["%03d-%s" % (i, c.get("note", "")[:30]) for i, c in enumerate(CASES)]


def value_of(c):
    return failure(revive(c["value"]) if "value" in c else json.loads(c["line"]))


@pytest.fixture(scope="module")
def policy():
    with backstop.load_policy(FILE["policy"]) as p:
        yield p


@pytest.mark.parametrize("c", CASES, ids=IDS)
def test_decide(policy, c):
    try:
        got = answer(policy.decide(value_of(c)))
    except backstop.InputError as e:
        got = answer(error=str(e))
    assert got == c["output"]


@pytest.mark.parametrize("c", CASES, ids=IDS)
def test_decide_many_goes_on_past_a_bad_entry(policy, c):
    good = {"attempt": 2, "http_status": 503, "random": 0.5, "now_ms": 0}
    want_good = answer(policy.decide(good))
    try:
        ds = policy.decide_many([good, value_of(c), good])
        got = answer(ds[1])
    except backstop.InputError as e:
        assert e.index == 1 and str(e).startswith("failures[1]: ") and e.decisions[1] is None
        ds = e.decisions
        got = answer(error=str(e)[len("failures[1]: "):])
    assert got == c["output"]
    assert answer(ds[0]) == want_good and answer(ds[2]) == want_good


def test_the_command_answers_every_line_case():
    lines = [c for c in FILE["cases"] if "value" not in c]
    data = b"".join((bytes.fromhex(c["line_hex"]) if "line_hex" in c else c["line"].encode()) + b"\n" for c in lines)
    r = subprocess.run([sys.executable, "-m", "backstop", "decide", "--policy", FILE["policy"]], input=data,
                       capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr
    got = r.stdout.decode().split("\n")
    assert got.pop() == ""
    assert len(got) == len(lines)
    for i, (g, c) in enumerate(zip(got, lines)):
        assert g == c["output"], "line %d (%s)" % (i, c.get("note"))


def test_a_stateful_policy_counts_exactly_the_valid_failures_of_a_batch():
    config = {"retry_budget": {"type": "token_bucket", "max_tokens": 3, "token_ratio": 0.5},
              "circuit_breaker": {"failure_threshold": 4, "open_for": "1s", "half_open_successes": 1}}
    bad = [{"attempt": 1, "http_stauts": 503}, {"attempt": 1, "idempotency_key": 0}, {"attempt": 1, "method": "x" * 70000},
           {"attempt": 0}, None, {"attempt": 1, "method": "\ud800", "random": 10 ** 400, "idempotency_key": []}]
    failures = [bad[i % len(bad)] if i % 3 == 1 else {"attempt": 1 + i % 4, "http_status": 503, "random": 0.5, "now_ms": 1767225600000 + 1000 * i}
                for i in range(30)]
    with backstop.load_policy(config) as batch, backstop.load_policy(config) as one:
        with pytest.raises(backstop.InputError) as e:
            batch.decide_many(failures)
        assert e.value.index == 1
        assert e.value.decisions == [None if i % 3 == 1 else one.decide(f) for i, f in enumerate(failures)]
