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
        directory.mkdir(parents=True, exist_ok=True)
        self.dir = directory
        self.port = _free_port()
        self.log = directory / "redis.log"
        self._args = [_binary("redis-server"), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                      "--appendonly", "no", "--dir", str(directory), "--protected-mode", "no", *extra]
        self.start()

    def start(self) -> None:
        """Starts the server (again, after stop: same port, same directory,
        so with ``--appendonly yes`` among extra it keeps its data)."""
        import redis

        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self._args, cwd=self.dir, stdout=log, stderr=subprocess.STDOUT,
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
            # The bus port is picked free too: port+10000, Redis's default, may
            # be taken by another server of a test running alongside.
            nodes.append(RedisServer(root / str(i), "--cluster-enabled", "yes", "--cluster-port", str(_free_port()),
                                     "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000"))
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


# -- RabbitMQ: a real rabbitmq-server (the Debian package) ------------------------
#
# Run directly (not the wrapper, which switches user) as an ordinary process
# on free loopback ports with a private data directory and HOME (the Erlang
# cookie), once per session (~6 s to start), and stopped at the end
# (/work/shared/notes/rabbitmq-local.md). A missing broker FAILS the tests.

RABBIT_BIN = Path("/usr/lib/rabbitmq/bin")


class RabbitServer:
    """A rabbitmq-server process owned by the test session."""

    def __init__(self, directory: Path) -> None:
        if not (RABBIT_BIN / "rabbitmq-server").exists():
            pytest.fail("%s/rabbitmq-server not found: the rabbitmq tests need a real broker; install the Debian "
                        "package rabbitmq-server (`make deps` does)" % RABBIT_BIN, pytrace=False)
        self.dir = directory
        for d in ("home", "log", "mnesia"):
            (directory / d).mkdir(parents=True, exist_ok=True)
        self.port, dist = _free_port(), _free_port()
        self.nodename = "bspy%dx%d@localhost" % (os.getpid(), self.port)
        (directory / "enabled_plugins").write_text("[].\n")  # no management: starts faster
        (directory / "rabbit.conf").write_text("listeners.tcp.default = 127.0.0.1:%d\nloopback_users = none\n"
                                               % self.port)
        self.env = dict(os.environ, HOME=str(directory / "home"), RABBITMQ_NODENAME=self.nodename,
                        RABBITMQ_MNESIA_BASE=str(directory / "mnesia"), RABBITMQ_LOG_BASE=str(directory / "log"),
                        RABBITMQ_ENABLED_PLUGINS_FILE=str(directory / "enabled_plugins"),
                        RABBITMQ_CONFIG_FILE=str(directory / "rabbit"), RABBITMQ_DIST_PORT=str(dist))
        self.url = "amqp://guest:guest@127.0.0.1:%d/" % self.port
        self.proc: Any = None
        self.start()

    def _accepts(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def start(self) -> None:
        log = open(self.dir / "out.log", "ab")
        self.proc = subprocess.Popen([str(RABBIT_BIN / "rabbitmq-server")], env=self.env, stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        up = wait_for(lambda: self._accepts() or self.proc.poll() is not None, 90) and self.proc.poll() is None
        if not up:
            self.stop()
            pytest.fail("rabbitmq-server on 127.0.0.1:%d did not start; see %s/out.log" % (self.port, self.dir),
                        pytrace=False)

    def stop(self) -> None:
        """Stops the broker (rabbitmqctl stop; a kill of its process group if
        that fails): its data stays, for start() again."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            subprocess.run([str(RABBIT_BIN / "rabbitmqctl"), "-n", self.nodename, "stop"], env=self.env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture(scope="session")
def rabbit(tmp_path_factory):
    s = RabbitServer(tmp_path_factory.mktemp("rabbit"))
    yield s
    s.stop()


@pytest.fixture
def r(redis_server):
    """A client of the session's redis-server, flushed for each test."""
    import redis

    c = redis.Redis(port=redis_server.port)
    c.flushall()
    yield c
    c.close()
