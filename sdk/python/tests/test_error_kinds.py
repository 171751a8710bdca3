"""Every row of the one table from language errors to error kinds
(contract/errorkinds.json) that Python follows gives its kind through
``backstop.describe`` (what ``retry`` and the queue's ``apply`` classify
with). requests, httpx and aiohttp rows use the library's own class when it
is installed, else a stand-in with the library's class names and bases."""
import asyncio
import errno
import importlib
import json
import socket
from pathlib import Path
from typing import Any, Callable, Dict, List

import pytest

from backstop import describe

TABLE = json.loads((Path(__file__).resolve().parents[3] / "contract" / "errorkinds.json").read_text())


def _standins() -> Dict[str, type]:
    """The libraries' exception classes, by their names and bases (from their
    sources): the classification reads names and bases only."""
    c: Dict[str, type] = {}

    def cls(qual: str, *bases: type) -> type:
        t = type(qual.rsplit(".", 1)[1], bases or (Exception,), {})
        t.__module__ = qual.rsplit(".", 1)[0]
        c[qual] = t
        return t
    # requests.exceptions
    req = cls("requests.exceptions.RequestException", IOError)
    rconn = cls("requests.exceptions.ConnectionError", req)
    rtime = cls("requests.exceptions.Timeout", req)
    cls("requests.exceptions.ConnectTimeout", rconn, rtime)
    cls("requests.exceptions.ReadTimeout", rtime)
    # httpx
    transport = cls("httpx.TransportError", cls("httpx.HTTPError"))
    htime = cls("httpx.TimeoutException", transport)
    cls("httpx.ConnectTimeout", htime)
    cls("httpx.ReadTimeout", htime)
    cls("httpx.ConnectError", cls("httpx.NetworkError", transport))
    # aiohttp
    aconn = cls("aiohttp.ClientConnectionError", cls("aiohttp.ClientError"))
    server_timeout = cls("aiohttp.ServerTimeoutError", cls("aiohttp.ServerConnectionError", aconn), asyncio.TimeoutError)
    cls("aiohttp.ConnectionTimeoutError", server_timeout)
    return c


STANDINS = _standins()


def third_party(qual: str) -> type:
    mod, name = qual.rsplit(".", 1)
    try:
        return getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError):
        return STANDINS[qual]


def refused() -> BaseException:
    """A real refused connection: a port nothing listens on."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except OSError as e:
        return e
    raise AssertionError("a connection to a closed port succeeded")


MAKERS: Dict[str, Callable[[], List[BaseException]]] = {
    "socket.gaierror EAI_AGAIN": lambda: [socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")],
    "socket.gaierror": lambda: [socket.gaierror(socket.EAI_NONAME, "Name or service not known")],
    "ConnectionRefusedError": lambda: [ConnectionRefusedError(), refused()],
    "ConnectionError": lambda: [ConnectionError(), ConnectionResetError(), BrokenPipeError(), ConnectionAbortedError()],
    "TimeoutError": lambda: [TimeoutError(), socket.timeout(), asyncio.TimeoutError()],
}


def kind(e: BaseException) -> str:
    return describe(e).get("error_kind", "")


@pytest.mark.parametrize("row", TABLE["python"], ids=[r[0] for r in TABLE["python"]])
def test_row(row):
    name, want = row
    if want == "codes":
        for code, k in TABLE["codes"].items():
            n = getattr(errno, code, None)
            if n is not None:
                assert kind(OSError(n, "x")) == k, code
        return
    if name in MAKERS:
        errs = MAKERS[name]()
    else:
        errs = [third_party(name)("x")]
    for e in errs:
        assert kind(e) == want, "%s: %r" % (name, e)


def test_connect_timeout_wins_over_what_it_wraps():
    # requests raises ConnectTimeout from urllib3's error around a socket timeout.
    e = third_party("requests.exceptions.ConnectTimeout")("x")
    e.__cause__ = socket.timeout("timed out")
    assert kind(e) == "connect_timeout"


def test_other_errors_have_no_kind():
    assert kind(ValueError("x")) == ""
