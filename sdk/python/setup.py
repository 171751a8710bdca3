"""Build hook: backstop.wasm and the scripts (the queue's and idempotency's
Lua, the PostgreSQL store's SQL) ship in every build of
this package without a second committed copy (so does errorkinds.json).

The repository keeps one copy of each: ``contract/backstop.wasm`` (``make
wasm``) and ``contract/scripts/*.lua``, ``*.sql``. Built from a checkout (``pip install
./sdk/python``, a git URL with ``#subdirectory=sdk/python``, an editable
install, an sdist or a wheel), this copies them into ``src/backstop``, where
pyproject.toml's package-data picks them up. An sdist carries the copies, so
a wheel built from it needs no checkout.
"""

import os
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
PACKAGE = HERE / "src" / "backstop"


def _put(src: Path, dst: Path) -> None:
    # Only when the bytes differ, and through a rename, so a test importing
    # the package meanwhile never reads a half-written file.
    data = src.read_bytes()
    if dst.is_file() and dst.read_bytes() == data:
        return
    tmp = dst.with_name("%s.%d.tmp" % (dst.name, os.getpid()))
    tmp.write_bytes(data)
    os.replace(tmp, dst)


def copy_assets() -> None:
    wasm, scripts = REPO / "contract" / "backstop.wasm", REPO / "contract" / "scripts"
    if (REPO / "go.mod").is_file() and wasm.is_file() and scripts.is_dir():
        _put(wasm, PACKAGE / "backstop.wasm")
        dest = PACKAGE / "scripts"
        dest.mkdir(exist_ok=True)
        lua = {p.name: p for p in [*scripts.glob("*.lua"), *scripts.glob("*.sql")]}
        for old in [*dest.glob("*.lua"), *dest.glob("*.sql")]:
            if old.name not in lua:  # a script renamed or removed
                old.unlink()
        for name, src in lua.items():
            _put(src, dest / name)
        _put(REPO / "contract" / "errorkinds.json", PACKAGE / "errorkinds.json")
    elif not (PACKAGE / "backstop.wasm").is_file() or not (PACKAGE / "scripts" / "lib.lua").is_file():
        raise SystemExit("backstop-policy: %s or %s is missing: run `make wasm` at the repository root" % (wasm, scripts))


class BuildPy(build_py):
    def run(self) -> None:
        copy_assets()
        super().run()


class Sdist(sdist):
    def run(self) -> None:
        copy_assets()
        super().run()


setup(cmdclass={"build_py": BuildPy, "sdist": Sdist})
