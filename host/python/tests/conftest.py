import asyncio
import inspect
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Dict

import pytest

VECTORS = Path(os.environ.get("BACKSTOP_VECTORS", Path(__file__).resolve().parents[3] / "testdata" / "vectors" / "vectors.json"))


def load_vectors() -> Dict[str, Any]:
    if not VECTORS.is_file():
        pytest.skip("shared vectors not found at %s (set BACKSTOP_VECTORS)" % VECTORS)
    return json.loads(VECTORS.read_text())


def vector_input(inp: Dict[str, Any]) -> Dict[str, Any]:
    """A vector input as decide() fields: absent random and now_ms are 0 in
    the vectors (decide would draw and read the clock)."""
    f = dict(inp)
    f.setdefault("random", 0)
    f.setdefault("now_ms", 0)
    if isinstance(f["random"], str):
        f["random"] = float(f["random"])  # "NaN", "Infinity", "-Infinity"
    return f


def group_source(g: Dict[str, Any]) -> Any:
    return g["preset"] if g.get("preset") else g["policy"]


# The one place where the Python tests wait: for a condition they can
# observe, polled until a deadline. The deadline catches a hang; it is never
# what a test asserts, so it is generous.
POLL_SECONDS = 0.01


def wait_for(cond: Callable[[], Any], timeout: float) -> Any:
    """Polls cond until it returns a truthy value, and returns that value;
    returns None once timeout seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() >= deadline:
            return None
        time.sleep(POLL_SECONDS)


def until(what: str, cond: Callable[[], Any], timeout: float = 30.0) -> Any:
    """wait_for, failing the test (naming what it waited for) on timeout."""
    v = wait_for(cond, timeout)
    if not v:
        pytest.fail("timed out after %gs waiting for %s" % (timeout, what), pytrace=False)
    return v


async def until_async(what: str, cond: Callable[[], Any], timeout: float = 30.0) -> Any:
    """until for a coroutine: cond may return a value or an awaitable, and
    the event loop runs between checks."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if inspect.isawaitable(v):
            v = await v
        if v:
            return v
        if time.monotonic() >= deadline:
            pytest.fail("timed out after %gs waiting for %s" % (timeout, what), pytrace=False)
        await asyncio.sleep(POLL_SECONDS)


def server_time_ms(r: Any) -> int:
    """Redis's clock, in unix ms: the one XPENDING idle times and due times
    are measured on."""
    s, us = r.time()
    return s * 1000 + us // 1000


# -- Redis: real redis-server processes (the Debian package) ----------------------
#
# The queue tests run against a real standalone server and a real 3-master
# Redis Cluster on free loopback ports, started once per session in a temp
# directory without persistence. A missing redis-server FAILS them (it is
# never a skip): `make deps` installs it.

import shutil
import socket
import subprocess


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail("%s not found on PATH: the queue tests need a real Redis; install the Debian package "
                    "redis-server (`make deps` does)" % name, pytrace=False)
    return path


def _free_port() -> int:
    # A cluster node also listens on port + 10000: stay at or below 55535.
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port <= 55535:
            return port


class RedisServer:
    """A redis-server process owned by the test session."""

    def __init__(self, directory: Path, *extra: str) -> None:
        import redis

        directory.mkdir(parents=True, exist_ok=True)
        self.dir = directory
        self.port = _free_port()
        self.log = directory / "redis.log"
        args = [_binary("redis-server"), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", str(directory), "--protected-mode", "no", *extra]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(args, cwd=directory, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        c = redis.Redis(port=self.port, socket_timeout=1)

        def answers() -> bool:
            try:
                return c.ping()
            except redis.RedisError:
                return False

        # A server that exited stops the wait too: its log says why.
        up = wait_for(lambda: answers() or self.proc.poll() is not None, 10) and self.proc.poll() is None
        c.close()
        if not up:
            self.stop()
            pytest.fail("redis-server on 127.0.0.1:%d did not answer:\n%s"
                        % (self.port, self.log.read_text(errors="replace")), pytrace=False)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    s = RedisServer(tmp_path_factory.mktemp("redis"))
    yield s
    s.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    """Three masters, slots spread by `redis-cli --cluster create`; yields
    their ports."""
    import redis

    root = tmp_path_factory.mktemp("redis-cluster")
    nodes = []
    try:
        for i in range(3):
            nodes.append(RedisServer(root / str(i), "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                                     "--cluster-node-timeout", "2000"))
        r = subprocess.run([_binary("redis-cli"), "--cluster", "create", *("127.0.0.1:%d" % n.port for n in nodes),
                            "--cluster-replicas", "0", "--cluster-yes"], capture_output=True, timeout=60)
        if r.returncode != 0:
            pytest.fail("redis-cli --cluster create failed:\n%s" % (r.stdout + r.stderr).decode(errors="replace"),
                        pytrace=False)
        for n in nodes:
            c = redis.Redis(port=n.port)
            until("cluster node 127.0.0.1:%d to be ready" % n.port,
                  lambda: b"cluster_state:ok" in c.execute_command("CLUSTER", "INFO"))
            c.close()
        yield [n.port for n in nodes]
    finally:
        for n in nodes:
            n.stop()
