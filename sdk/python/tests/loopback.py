"""Real HTTP servers on 127.0.0.1 for the layer tests (test_layers.py,
test_layers_cases.py): a WSGI application served by wsgiref in a thread
(one thread per request, so a server may call another), and urllib as the
client, with no proxy."""
import http
import threading
import urllib.error
import urllib.request
from socketserver import ThreadingMixIn
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

# The request headers the scripted server records (testdata/layers/README.md).
SEEN = ("backstop-attempt", "x-envoy-attempt-count")
# The response headers that say something about retrying.
SIGNALS = ("backstop-no-retry", "x-envoy-overloaded")

# Loopback only: a proxy from the environment must not see these calls.
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


class Served:
    """A WSGI app served on a loopback port: ``url``; ``close()`` stops it."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.server = make_server("127.0.0.1", 0, app, server_class=_Server, handler_class=_Quiet)
        self.url = "http://127.0.0.1:%d/" % self.server.server_port
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join()

    def __enter__(self) -> "Served":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def status_line(status: int) -> str:
    return "%d %s" % (status, http.HTTPStatus(status).phrase)


class Scripted(Served):
    """A scripted server: it answers ``responses`` ([{status, headers}], the
    last one again for every later call) with an empty body, and records the
    attempt headers of each call (absent ones left out) in ``seen``."""

    def __init__(self, responses: List[Dict[str, Any]]) -> None:
        self.responses = responses
        self.seen: List[Dict[str, str]] = []
        self._lock = threading.Lock()
        super().__init__(self._app)

    def _app(self, environ: Dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        h = {n: environ["HTTP_" + n.upper().replace("-", "_")] for n in SEEN
             if environ.get("HTTP_" + n.upper().replace("-", "_"))}
        with self._lock:
            self.seen.append(h)
            r = self.responses[min(len(self.seen), len(self.responses)) - 1]
        start_response(status_line(r["status"]), list((r.get("headers") or {}).items()))
        return [b""]

    def calls(self) -> int:
        return len(self.seen)


def get(url: str, headers: Optional[Mapping[str, str]] = None) -> Any:
    """A GET through urllib: the response (status < 400, read and closed),
    or urllib's HTTPError, which @policy.retry describes by its code and
    headers."""
    req = urllib.request.Request(url, headers=dict(headers or {}))
    with _opener.open(req, timeout=10) as r:
        r.read()
        return r


def signals(headers: Any) -> Dict[str, str]:
    """The retry signals of a response's headers (names in lower case)."""
    return {n: headers[n] for n in SIGNALS if headers.get(n) is not None}


def answer(url: str) -> Dict[str, Any]:
    """A GET's status, signals and body, whatever the status."""
    try:
        r = _opener.open(urllib.request.Request(url), timeout=10)
    except urllib.error.HTTPError as e:
        r = e
    with r:
        return {"status": r.status, "signals": signals(r.headers), "body": r.read()}


def blackhole() -> Tuple[str, Callable[[], None]]:
    """A peer on 127.0.0.1 whose connects hang ("host:port", close): a
    socket listening with a backlog of 0, never accepting, its queue
    filled. The kernel drops further SYNs, so a client's connect runs into
    its own connect timeout, as behind a black-holing firewall (offline,
    unlike a non-routable address, which may fail at once)."""
    import socket
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(0)
    addr = "127.0.0.1:%d" % lsock.getsockname()[1]
    held: List[socket.socket] = [lsock]

    def close() -> None:
        for s in held:
            s.close()

    for _ in range(16):  # one connection fills it on Linux
        c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        c.settimeout(0.2)
        try:
            c.connect(lsock.getsockname())
        except socket.timeout:
            c.close()
            return addr, close
        held.append(c)
    close()
    raise AssertionError("blackhole: %s still accepts connections after 16" % addr)
