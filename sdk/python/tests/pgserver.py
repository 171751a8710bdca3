"""A private PostgreSQL server for the idempotency tests: initdb into a fresh
temporary directory, then postgres (the Debian package postgresql, from
/usr/lib/postgresql/<newest>/bin) on a free 127.0.0.1 port with its socket in
that directory; never the system service. PostgreSQL refuses to run as root:
as root the server runs as the package's system user postgres. A missing
postgres fails the tests; they never skip."""

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

from conftest import wait_for

SUPERUSER = "backstop"
PASSWORD = "pgtest-s3cret-password"


def _bin() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=lambda p: int(p.parent.parent.name))
    if not found:
        pytest.fail("postgres not found in /usr/lib/postgresql/*/bin: run `make deps`, which installs the Debian "
                    "package postgresql", pytrace=False)
    return found[-1].parent


class PostgresServer:
    """A postgres process owned by the test session; ``url`` carries the
    superuser's password (scram-sha-256 over TCP), as a production DSN does."""

    def __init__(self) -> None:
        b = _bin()
        self.dir = Path(tempfile.mkdtemp(prefix="backstop-pg-"))
        user = {}
        if os.geteuid() == 0:
            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                pytest.fail("running as root and there is no system user postgres (the Debian package postgresql "
                            "creates it)", pytrace=False)
            user = {"user": pw.pw_uid, "group": pw.pw_gid}
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        pwfile = self.dir / "pwfile"
        pwfile.write_text(PASSWORD + "\n")
        pwfile.chmod(0o600)
        if user:
            os.chown(pwfile, user["user"], user["group"])
        env = {"LC_ALL": "C", "PATH": "/usr/bin:/bin"}
        init = subprocess.run([str(b / "initdb"), "-D", str(self.dir / "data"), "-U", SUPERUSER, "--pwfile", str(pwfile),
                               "--auth-host=scram-sha-256", "--auth-local=trust", "-E", "UTF8", "--no-sync"],
                              cwd=self.dir, env=env, capture_output=True, text=True, **user)
        if init.returncode != 0:
            pytest.fail("initdb: %s%s" % (init.stdout, init.stderr), pytrace=False)
        pwfile.unlink()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log = self.dir / "postgres.log"
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [str(b / "postgres"), "-D", str(self.dir / "data"), "-k", str(self.dir), "-h", "127.0.0.1",
                 "-p", str(self.port), "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"],
                cwd=self.dir, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, **user)
        self.url = "postgresql://%s:%s@127.0.0.1:%d/postgres" % (SUPERUSER, quote(PASSWORD, safe=""), self.port)

        def answers() -> bool:
            try:
                psycopg.connect(self.url, connect_timeout=2).close()
                return True
            except psycopg.Error:
                return False

        if not (wait_for(lambda: answers() or self.proc.poll() is not None, 30) and self.proc.poll() is None):
            self.stop()
            pytest.fail("postgres on 127.0.0.1:%d did not answer:\n%s" % (self.port, self.log.read_text(errors="replace")),
                        pytrace=False)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # a fast shutdown
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
