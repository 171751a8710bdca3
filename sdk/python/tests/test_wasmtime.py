"""The wasmtime under the Python host (issue 19): the supported range, the
checks that guard the fast path (wasmtime's C function called through
ctypes), both call paths on every shared vector, and a compiled-module cache
that never loads a file made by another wasmtime or configuration.

`make test` runs this file on the oldest and the newest wasmtime the package
allows, each time once as is and once with BACKSTOP_FAST_PATH=0, and points
BACKSTOP_OTHER_PYTHON at the other virtualenv's interpreter."""

import ctypes
import json
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import wasmtime

import backstop
from backstop._host import runtime as _runtime
from backstop._policy import load_into
from backstop._host.runtime import Instance, _SlowFn, load_module

from conftest import group_source, load_vectors
from test_vectors import run_batches, run_cases

ROOT = Path(__file__).resolve().parents[3]
FORCED = os.environ.get("BACKSTOP_FAST_PATH", "").strip().lower() in ("0", "false", "off", "no")
TINY = wasmtime.wat2wasm('(module (func (export "f") (param i32) (result i32) local.get 0 i32.const 7 i32.add))')


def uses_fast_path(inst: Instance) -> bool:
    return not isinstance(inst.decide, _SlowFn)


def new_engine(settings=None):
    """An engine made as Instance makes its own (settings None), or with settings."""
    return _runtime._new_engine(_runtime._ENGINE_SETTINGS if settings is None else settings)


def instance_settings():
    return _runtime._ENGINE_SETTINGS


# -- the supported range -----------------------------------------------------------


def test_the_allowed_range_is_the_proven_one():
    """pyproject.toml allows exactly the majors the fast path is proven on,
    `make test` pins the oldest and the newest of them, the README names
    them, and the installed wasmtime is one of them."""
    first, last = _runtime.WASMTIME_PROVEN
    spec = "wasmtime>=%d,<%d" % (first, last + 1)
    pyproject = (ROOT / "sdk/python/pyproject.toml").read_text()
    assert re.search(r'^dependencies = \["%s"\]$' % re.escape(spec), pyproject, re.M), pyproject
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^WASMTIME_OLDEST\s*:= %d\.\d+\.\d+$" % first, makefile, re.M)
    assert re.search(r"^WASMTIME_NEWEST\s*:= %d\.\d+\.\d+$" % last, makefile, re.M)
    assert "`%s`" % spec in (ROOT / "sdk/python/README.md").read_text()
    assert first <= _runtime._major(_runtime._WASMTIME_VERSION) <= last


def test_the_fast_path_is_used_where_it_is_proven():
    """On every wasmtime of the range the checks pass and the fast path is
    taken, unless BACKSTOP_FAST_PATH=0 turned it off. (A check that found a
    problem here would silently slow every decision down.)"""
    inst = Instance()
    if FORCED:
        level, why = _runtime._RAW_PROBLEM
        assert level == logging.INFO and "BACKSTOP_FAST_PATH" in why
        assert not uses_fast_path(inst)
    else:
        assert _runtime._RAW_PROBLEM is None
        assert uses_fast_path(inst)
    assert _runtime._raw_path_problem() is None  # what BACKSTOP_FAST_PATH=0 skipped holds too


# -- the checks --------------------------------------------------------------------


def _declared(argtypes, restype):
    return types.SimpleNamespace(argtypes=argtypes, restype=restype)


class _Narrow(ctypes.Union):
    """wasmtime_val_raw_t as it might become: 8 bytes, i64 narrowed."""
    _fields_ = [("i32", ctypes.c_int32), ("i64", ctypes.c_int32), ("f64", ctypes.c_double)]


class _Small(ctypes.Union):
    _fields_ = [("i32", ctypes.c_int32), ("i64", ctypes.c_int64), ("f64", ctypes.c_double)]


def _break(monkeypatch, what):
    """Makes the installed wasmtime look like one the fast path is not
    proven on; returns the version to check."""
    from wasmtime import _bindings as bindings
    from wasmtime import _ffi as ffi

    P = ctypes.POINTER
    real = bindings._wasmtime_func_call_unchecked
    if what == "newer":
        return "51.0.0"
    if what == "older":
        return "47.0.1"
    if what == "unknown":
        monkeypatch.setattr(_runtime, "_WASMTIME_VERSION", None)
    elif what == "extra parameter":
        monkeypatch.setattr(bindings, "_wasmtime_func_call_unchecked",
                            _declared(list(real.argtypes) + [ctypes.c_size_t], real.restype))
    elif what == "old signature":  # wasmtime 0.3x: (store, func, args_and_results)
        monkeypatch.setattr(bindings, "_wasmtime_func_call_unchecked", _declared(list(real.argtypes[:3]), real.restype))
    elif what == "result type":
        monkeypatch.setattr(bindings, "_wasmtime_func_call_unchecked", _declared(real.argtypes, P(ffi.wasm_trap_t)))
    elif what == "union field":
        monkeypatch.setattr(ffi, "wasmtime_val_raw_t", _Narrow)
    elif what == "union size":
        monkeypatch.setattr(ffi, "wasmtime_val_raw_t", _Small)
    elif what == "bindings gone":
        monkeypatch.delattr(bindings, "_wasmtime_func_call_unchecked")
    elif what == "store internals":
        monkeypatch.delattr(wasmtime.Store, "_context")
    elif what == "symbol gone":
        class Dll:
            def __getitem__(self, name):
                raise AttributeError("undefined symbol: %s" % name)
        monkeypatch.setattr(ffi, "dll", Dll())
    elif what == "wrong results":
        real_fn = _runtime._Raw.fn

        def off_by_one(self, *args):
            call = real_fn(self, *args)
            return lambda *a: call(*a) + 1
        monkeypatch.setattr(_runtime._Raw, "fn", off_by_one)
    elif what == "lost trap":
        real_fn = _runtime._Raw.fn

        def swallowing(self, store, fn, params, result, on_trap, tick):
            return real_fn(self, store, fn, params, result, lambda e: 0, tick)
        monkeypatch.setattr(_runtime._Raw, "fn", swallowing)
    else:
        raise AssertionError(what)
    return None


PROBLEMS = {
    "newer": r"^wasmtime 51\.0\.0 is outside the range the fast path is proven on \(48\.x to 50\.x\)$",
    "older": r"^wasmtime 47\.0\.1 is outside the range",
    "unknown": r"^the installed wasmtime's version is unknown",
    "extra parameter": r"^wasmtime_func_call_unchecked is declared as .*, not as the fast path calls it$",
    "old signature": r"^wasmtime_func_call_unchecked is declared as",
    "result type": r"^wasmtime_func_call_unchecked is declared as",
    "union field": r"^wasmtime_val_raw_t\.i64 is not a c_long(long)? at offset 0$",
    "union size": r"^wasmtime_val_raw_t is not a 16-byte union \(8 bytes\)$",
    "bindings gone": r"^cannot check wasmtime's internals \(AttributeError",
    "store internals": r"^wasmtime\.Store\._context is missing$",
    "symbol gone": r"^cannot check wasmtime's internals \(AttributeError: undefined symbol: wasmtime_func_call_unchecked\)$",
    "wrong results": r"^a call through the fast path returned \d+ where the public API returned \d+ \(f\d",
    "lost trap": r"^a trap through the fast path went unnoticed$",
}


@pytest.mark.parametrize("what", sorted(PROBLEMS))
def test_anything_unproven_is_refused(monkeypatch, what):
    """The version, the C signature as wasmtime-py's bindings declare it,
    the union's layout, the internals used, and calls through the fast path
    compared with the public API: each one that does not hold is the
    reason the fast path is not taken."""
    version = _break(monkeypatch, what)
    problem = _runtime._raw_path_problem(version)
    assert problem is not None and re.search(PROBLEMS[what], problem), problem


def test_unproven_takes_the_public_api_and_says_so_once(monkeypatch, caplog):
    """An unproven wasmtime runs every call through wasmtime's public API and
    logs one warning, whatever the number of instances."""
    monkeypatch.setattr(_runtime, "_RAW_PROBLEM", (logging.WARNING, _runtime._raw_path_problem("51.0.0")))
    monkeypatch.setattr(_runtime, "_logged", False)
    monkeypatch.setattr(_runtime, "_compile_logged", True)  # a cold cache says so too
    caplog.set_level(logging.INFO, logger="backstop")
    insts = [Instance(), Instance()]
    assert not any(uses_fast_path(i) for i in insts)
    with load_into(insts[1], "default") as p:
        assert p.decide(attempt=1, http_status=503, random=0.5, now_ms=0).to_dict() == \
            {"action": "retry", "delay_ms": 500, "reason": "transient", "class": "retryable"}
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [(
        "backstop", logging.WARNING, "backstop: calling backstop.wasm through wasmtime's public API (slower): "
        "wasmtime 51.0.0 is outside the range the fast path is proven on (48.x to 50.x)")]


def test_the_environment_turns_the_fast_path_off():
    """BACKSTOP_FAST_PATH=0: the public API, said once at INFO; the same
    answers as the fast path, line for line, through the cross-host
    command."""
    probe = ("import logging; logging.basicConfig(level=logging.INFO, format='%(name)s %(levelname)s %(message)s')\n"
             "from backstop._host.runtime import Instance, _SlowFn\n"
             "print(*[type(Instance().decide) is _SlowFn for _ in range(2)])")
    env = {k: v for k, v in os.environ.items() if k != "BACKSTOP_FAST_PATH"}
    off = subprocess.run([sys.executable, "-c", probe], env={**env, "BACKSTOP_FAST_PATH": "0"},
                         capture_output=True, text=True, timeout=120, check=True)
    assert off.stdout == "True True\n"
    assert off.stderr == ("backstop INFO backstop: calling backstop.wasm through wasmtime's public API (slower): "
                          "the fast path is turned off (BACKSTOP_FAST_PATH=0)\n")
    on = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120, check=True)
    assert (on.stdout, on.stderr) == ("False False\n", "")

    lines = "".join(json.dumps(c["input"]) + "\n" for g in load_vectors()["groups"] for c in g["cases"] if "input" in c)
    cmd = [sys.executable, "-m", "backstop", "decide", "--policy", "critical", "--random", "0"]
    answers = [subprocess.run(cmd, input=lines, env=e, capture_output=True, text=True, timeout=120).stdout
               for e in ({**env, "BACKSTOP_FAST_PATH": "0"}, env)]
    assert answers[0].count("\n") == lines.count("\n") > 3000
    assert answers[0] == answers[1]


# -- both paths, every vector --------------------------------------------------------


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "public-api"])
def test_every_vector_through_both_paths(fast):
    """Every shared vector through the fast path and through wasmtime's
    public API (test_vectors.py runs them through the process's instance,
    whichever path it took)."""
    inst = Instance(fast=fast)
    assert uses_fast_path(inst) == (fast and not FORCED)
    for g in load_vectors()["groups"]:
        src = group_source(g)
        src = src if isinstance(src, str) else json.dumps(src).encode()
        with load_into(inst, src) as p:
            run_cases(p, g["cases"])
        with load_into(inst, src) as p:
            run_batches(p, g["cases"])


# -- the compiled-module cache ------------------------------------------------------


@pytest.fixture
def spy(monkeypatch):
    """Counts compilations and records every cache file handed to wasmtime."""
    calls = {"compiled": 0, "loaded": []}
    real = wasmtime.Module

    class Spy(real):
        def __init__(self, engine, wasm):
            calls["compiled"] += 1
            super().__init__(engine, wasm)

        @classmethod
        def deserialize_file(cls, engine, path):
            calls["loaded"].append(Path(path).name)
            return real.deserialize_file(engine, path)

        @classmethod
        def deserialize(cls, engine, encoded):
            calls["loaded"].append("<bytes>")
            return real.deserialize(engine, encoded)

    monkeypatch.setattr(wasmtime, "Module", Spy)
    return calls


def entries(cache: Path):
    return sorted(p.name for p in cache.iterdir())


def run7(engine, module):
    store = wasmtime.Store(engine)
    return wasmtime.Instance(store, module, []).exports(store)["f"](store, 35)


def test_the_cache_key_covers_the_engine_configuration(tmp_path, spy):
    """A module compiled by an engine configured otherwise is not loaded:
    each configuration has its own entry, and its facts file says which."""
    cache = tmp_path / "cache"
    plain = new_engine(())
    load_module(plain, TINY, cache)
    engine = new_engine()
    assert run7(engine, load_module(engine, TINY, cache, instance_settings())) == 42
    assert (spy["compiled"], spy["loaded"]) == (2, [])
    assert len(entries(cache)) == 4
    assert run7(engine, load_module(engine, TINY, cache, instance_settings())) == 42  # its own entry: loaded
    assert run7(plain, load_module(plain, TINY, cache)) == 42
    assert spy["compiled"] == 2 and len(spy["loaded"]) == 2 and len(set(spy["loaded"])) == 2
    facts = [json.loads((cache / n).read_text()) for n in entries(cache) if n.endswith(".json")]
    assert sorted(f["engine"] for f in facts) == [[], [list(kv) for kv in instance_settings()]]


# A stand-in module with the whole ABI, quick to compile.
STAND_IN = wasmtime.wat2wasm("""(module
  (memory (export "memory") 1)
  (func (export "_initialize"))
  (func (export "abi_version") (result i32) i32.const 1)
  (func (export "buffer") (param i32) (result i32) i32.const 1024)
  (func (export "policy_load") (param i32) (result i32) i32.const 1)
  (func (export "policy_preset") (param i32) (result i32) i32.const 1)
  (func (export "policy_free") (param i32) (result i32) i32.const 0)
  (func (export "policy_stateful") (param i32) (result i32) i32.const 0)
  (func (export "decide") (param i32 i64 i32 i32 i64 i64 f64 i64 i32 i32 i32 i32) (result i64) i64.const 0)
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
  (func (export "error_message") (result i64) i64.const 0))""")


def test_instances_cache_with_their_configuration(tmp_path):
    """An Instance's entry says how its engine was configured."""
    Instance(STAND_IN, cache_dir=tmp_path)
    (facts,) = tmp_path.glob("*.json")
    f = json.loads(facts.read_text())
    assert f["engine"] == [list(kv) for kv in instance_settings()]
    assert f["wasmtime"] == _runtime._WASMTIME_VERSION
    assert set(f) == {"cache", "module", "wasmtime", "library", "engine", "machine", "cpu"}


@pytest.mark.parametrize("fact, other", [
    ("_WASMTIME_VERSION", "0.0.0+another-build"),
    ("_CPU_FEATURES", "a CPU without this one's features"),
])
def test_the_cache_key_covers_wasmtime_and_the_cpu(tmp_path, monkeypatch, spy, fact, other):
    cache = tmp_path / "cache"
    engine = new_engine()
    with monkeypatch.context() as m:
        m.setattr(_runtime, fact, other)
        load_module(engine, TINY, cache, instance_settings())
    load_module(engine, TINY, cache, instance_settings())
    assert (spy["compiled"], spy["loaded"]) == (2, [])
    assert len(entries(cache)) == 4


def _take_over(foreign: Path, ours: Path) -> None:
    """Puts the one cache entry in foreign under the names of the one in
    ours: what a key that misses a difference would do."""
    (src,) = foreign.glob("*.cwasm")
    (dst,) = ours.glob("*.cwasm")
    shutil.copyfile(src, dst)
    shutil.copyfile(src.with_suffix(".json"), dst.with_suffix(".json"))


def test_a_foreign_entry_under_this_key_is_not_loaded(tmp_path, monkeypatch, spy):
    """Even under this process's key, a module whose facts are another
    wasmtime's, or that has no facts, is never handed to wasmtime."""
    engine = new_engine()
    cache, foreign = tmp_path / "cache", tmp_path / "foreign"
    load_module(engine, TINY, cache, instance_settings())
    with monkeypatch.context() as m:
        m.setattr(_runtime, "_WASMTIME_VERSION", "0.0.0+another-build")
        load_module(engine, TINY, foreign, instance_settings())
    _take_over(foreign, cache)
    assert run7(engine, load_module(engine, TINY, cache, instance_settings())) == 42
    assert (spy["compiled"], spy["loaded"]) == (3, [])
    next(cache.glob("*.json")).unlink()  # a module without its facts (an older backstop's entry)
    load_module(engine, TINY, cache, instance_settings())
    assert (spy["compiled"], spy["loaded"]) == (4, [])
    load_module(engine, TINY, cache, instance_settings())  # rewritten whole: loaded
    assert (spy["compiled"], spy["loaded"]) == (4, [next(cache.glob("*.cwasm")).name])


def test_a_cache_entry_from_the_other_wasmtime_is_not_loaded(tmp_path, spy):
    """The other wasmtime of the matrix (BACKSTOP_OTHER_PYTHON, set by `make
    test`) writes a cache entry for the same module with the same engine
    settings; this wasmtime neither loads it where it lies nor under its
    own key, and still loads its own."""
    other = os.environ.get("BACKSTOP_OTHER_PYTHON")
    if not other:
        # make test sets it; under CI a missing matrix is a failure, never a skip.
        if os.environ.get("CI"):
            pytest.fail("BACKSTOP_OTHER_PYTHON (a Python with the other wasmtime of the matrix) is not set under CI")
        pytest.skip("BACKSTOP_OTHER_PYTHON (a Python with the other wasmtime of the matrix) is not set; make test sets it")
    wasm, cache, foreign = tmp_path / "tiny.wasm", tmp_path / "cache", tmp_path / "foreign"
    wasm.write_bytes(TINY)
    writer = ("import sys; from pathlib import Path; from backstop._host import runtime as r\n"
              "e = r._new_engine(r._ENGINE_SETTINGS)\n"
              "r.load_module(e, Path(sys.argv[1]).read_bytes(), Path(sys.argv[2]), r._ENGINE_SETTINGS)\n"
              "print(r._WASMTIME_VERSION)")
    r = subprocess.run([other, "-c", writer, str(wasm), str(foreign)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    theirs = r.stdout.strip()
    assert theirs != _runtime._WASMTIME_VERSION, "BACKSTOP_OTHER_PYTHON has this same wasmtime %s" % theirs
    assert json.loads(next(foreign.glob("*.json")).read_text())["wasmtime"] == theirs

    engine = new_engine()
    shutil.copytree(foreign, cache)
    assert run7(engine, load_module(engine, TINY, cache, instance_settings())) == 42
    assert (spy["compiled"], spy["loaded"]) == (1, [])
    assert len(entries(cache)) == 4
    ours = tmp_path / "ours"
    ours.mkdir(mode=0o700)
    for n in entries(cache):
        if json.loads((cache / n).with_suffix(".json").read_text())["wasmtime"] != theirs:
            shutil.copyfile(cache / n, ours / n)
    _take_over(foreign, ours)
    assert run7(engine, load_module(engine, TINY, ours, instance_settings())) == 42
    assert (spy["compiled"], spy["loaded"]) == (2, [])
    load_module(engine, TINY, ours, instance_settings())
    assert (spy["compiled"], spy["loaded"]) == (2, [next(ours.glob("*.cwasm")).name])


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="Winch is used on x86-64 only")
def test_instances_compile_with_winch_on_x86_64():
    """The strategy wasmtime-py cannot spell is really set (through the C
    API): the instances' engine makes other machine code than Cranelift,
    and runs it."""
    assert ("strategy", "winch") in instance_settings()
    winch, cranelift = new_engine(), new_engine((("memory_may_move", False), ("strategy", "cranelift")))
    ours, theirs = wasmtime.Module(winch, TINY), wasmtime.Module(cranelift, TINY)
    assert ours.serialize() != theirs.serialize()
    assert run7(winch, ours) == 42


def test_an_engine_setting_wasmtime_lacks_is_an_error():
    """Not a plain attribute set on the Config, which would change nothing:
    memory that may move would leave the shared buffer's address dangling."""
    with pytest.raises(backstop.BackstopError, match="this wasmtime has no engine setting memory_may_mov$"):
        _runtime._new_engine((("memory_may_mov", False),))
