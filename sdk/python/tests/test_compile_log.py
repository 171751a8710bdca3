"""Issue 13: the first load_policy on a machine compiles backstop.wasm for
about a second; it says so once, through logging (logger "backstop"), and
not again once the compiled module is cached."""
import os
import subprocess
import sys

PROBE = "import backstop\nbackstop.load_policy('default')\nbackstop.load_policy('critical')\n"


def run(cache_dir, probe=PROBE):
    env = dict(os.environ, BACKSTOP_CACHE_DIR=str(cache_dir))
    r = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stderr


def test_a_cold_cache_says_it_compiles_once(tmp_path):
    # No logging configured: a warning reaches stderr through logging's last resort.
    lines = run(tmp_path).splitlines()
    assert lines == ["backstop: compiling backstop.wasm for this machine, up to a second "
                     "(once: the result is cached in %s)" % tmp_path], lines
    assert run(tmp_path) == ""  # cached: nothing to say


def test_no_cache_says_so_at_info():
    probe = ("import logging; logging.basicConfig(level=logging.INFO, format='%(name)s %(levelname)s %(message)s')\n"
             + PROBE)
    lines = [l for l in run("", probe).splitlines() if "compiling" in l]
    assert lines == ["backstop INFO backstop: compiling backstop.wasm for this machine, up to a second "
                     "(no cache: every process compiles it)"], lines
