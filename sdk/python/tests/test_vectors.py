"""Every shared vector, through decide, decide_many and wasmtime's public API."""

import json

import pytest

import backstop
from backstop._policy import Policy, load_into
from backstop._host.runtime import Instance

from conftest import group_source, load_vectors, vector_input

GROUPS = load_vectors()["groups"]


def test_abi_version_matches_vectors():
    assert load_vectors()["abi_version"] == backstop.ABI_VERSION


@pytest.mark.parametrize("g", GROUPS, ids=["%02d-%s" % (i, g["name"]) for i, g in enumerate(GROUPS)])
def test_decide(g):
    with backstop.load_policy(group_source(g)) as p:
        assert p.stateful == g.get("stateful", False)
        run_cases(p, g["cases"])


def run_cases(p: Policy, cases):
    for i, c in enumerate(cases):
        if "op" in c:
            run_op(p, i, c)
            continue
        want = c["expect"]
        if "error" in want:
            with pytest.raises(backstop.InputError) as e:
                p.decide(vector_input(c["input"]))
            assert str(e.value) == want["error"], "case %d" % i
        else:
            assert p.decide(vector_input(c["input"])).to_dict() == want, "case %d: %s" % (i, c["input"])


@pytest.mark.parametrize("g", GROUPS, ids=["%02d-%s" % (i, g["name"]) for i, g in enumerate(GROUPS)])
def test_decide_many(g):
    """decide_many over each run of inputs between successes and acquires
    equals decide."""
    with backstop.load_policy(group_source(g)) as p:
        run_batches(p, g["cases"])


def run_batches(p: Policy, cases):
    """The cases with each run of decisions between the other ops (success,
    acquire, attempt_timeout) through one decide_many."""
    run = []
    for c in cases + [{"op": "success", "now_ms": -1}]:
        if "op" not in c:
            run.append(c)
            continue
        if run:
            check_batch(p, run)
            run = []
        if c.get("now_ms", 0) >= 0:
            run_op(p, -1, c)


def run_op(p: Policy, i: int, c):
    """A case that is not a decision: success, acquire or attempt_timeout."""
    if c["op"] == "success":
        p.record_success(c.get("now_ms", 0))
    elif c["op"] == "duration":
        p.record_duration(c.get("duration_ms", 0), c["now_ms"])
    elif c["op"] == "acquire":
        assert p.acquire(c["now_ms"]).to_dict() == c["permit"], "case %d: acquire at %d" % (i, c["now_ms"])
    elif c["op"] == "connect_timeout":
        want = c["timeout_ms"] / 1000 if c["timeout_ms"] else None
        assert p.connect_timeout == want, "case %d: connect_timeout %r, want %r" % (i, p.connect_timeout, want)
    elif c["op"] == "attempt_timeout":
        if "error" in c:
            with pytest.raises(backstop.InputError) as e:
                p.attempt_timeout(c.get("elapsed_ms", 0))
            assert str(e.value) == c["error"], "case %d" % i
        else:
            assert p.attempt_timeout(c.get("elapsed_ms", 0)) == c["timeout_ms"], "case %d: %s" % (i, c)
    else:
        raise AssertionError("case %d: unknown op %r" % (i, c["op"]))


def check_batch(p: Policy, cases):
    want = [c["expect"] for c in cases]
    bad = [i for i, w in enumerate(want) if "error" in w]
    try:
        got = p.decide_many([vector_input(c["input"]) for c in cases])
        assert not bad
    except backstop.InputError as e:
        assert bad and e.index == bad[0]
        assert str(e) == "failures[%d]: %s" % (bad[0], want[bad[0]]["error"])
        got = e.decisions
    for i, (d, w) in enumerate(zip(got, want)):
        assert (d is None) if "error" in w else (d.to_dict() == w), "case %d" % i


def test_public_api_fallback():
    """The slow path (wasmtime's public Func calls) decides the same."""
    inst = Instance(fast=False)
    for g in GROUPS:
        if g["name"] in ("invalid", "circuit", "circuit/acquire", "budget/token_bucket", "preset/default"):
            src = group_source(g)
            with load_into(inst, src if isinstance(src, str) else json.dumps(src).encode()) as p:
                run_cases(p, g["cases"])
