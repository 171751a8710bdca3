"""The shared layer cases (testdata/layers/cases.json, see its README)
replayed in Python: a scripted bottom server, a middle server wrapped in
OneLayerWSGI whose handler calls the bottom through @policy.retry, and a
top @policy.retry with the attempt headers on, all real HTTP servers on
loopback (wsgiref) called with urllib; what they did compared with what the
Go loop and middleware did. (No ASGI server is installed: OneLayerASGI is
tested in process in test_layers.py.)"""
import json
import os
import threading
import urllib.error
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Optional

import pytest

import backstop
from backstop import OneLayerWSGI, RetryError

from loopback import Scripted, Served, get, signals, status_line

PATH = Path(os.environ.get("BACKSTOP_LAYERS_CASES",
                           Path(__file__).resolve().parents[3] / "testdata" / "layers" / "cases.json"))
# Read at collection; a missing or broken file fails test_the_file_is_there
# (never a skip): `make layers-cases` writes it.
try:
    FILE: Dict[str, Any] = json.loads(PATH.read_text())
    UNREADABLE: Optional[Exception] = None
except (OSError, ValueError) as e:
    FILE, UNREADABLE = {"cases": []}, e

# The middle's breaker, when the case opens it before it starts.
OPEN_BREAKER = {"failure_threshold": 1, "open_for": "1h"}


def test_the_file_is_there_with_cases():
    if UNREADABLE is not None:
        pytest.fail("%s: %s (make layers-cases writes it)" % (PATH, UNREADABLE), pytrace=False)
    assert isinstance(FILE.get("cases"), list) and FILE["cases"], "no cases"


class Middle:
    """OneLayerWSGI with the middle policy as its one policy; its handler
    calls the bottom through @policy.retry and answers 200, or the status
    of the bottom's last response when the loop gave up."""

    def __init__(self, c: Dict[str, Any], bottom: Scripted) -> None:
        config = c["middle"].get("policy") or FILE["policy"]
        if c["middle"].get("breaker_open"):
            config = {**config, "circuit_breaker": OPEN_BREAKER}
        self.policy = backstop.load_policy(config)
        if c["middle"].get("breaker_open"):
            self.policy.decide(attempt=1, http_status=503)
        self.bottom = bottom
        self.count = 0
        self._lock = threading.Lock()
        wrapped = OneLayerWSGI(self._app, policies=[self.policy])

        def counted(environ: Dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            with self._lock:
                self.count += 1
            return wrapped(environ, start_response)
        self.served = Served(counted)
        self.url = self.served.url

    def _app(self, environ: Dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        headers: Dict[str, str] = {}
        status = 200
        try:
            self.policy.retry(headers=headers)(lambda: get(self.bottom.url, headers))()
        except RetryError as e:
            # A loop that made no call (its breaker refused it) has no response.
            status = getattr(e.last_exception, "code", 503)
        start_response(status_line(status), [("content-type", "text/plain")])
        return [b""]

    def close(self) -> None:
        self.served.close()
        self.policy.close()


def run(c: Dict[str, Any]) -> Dict[str, Any]:
    bottom = Scripted(c["bottom"])
    middle = Middle(c, bottom) if "middle" in c else None
    top = backstop.load_policy(c.get("policy") or FILE["policy"])
    inner = backstop.load_policy(FILE["policy"]) if c.get("inner_loop") else None
    try:
        attempts = 0
        middle_headers: Dict[str, str] = {}
        headers: Dict[str, str] = {}

        def call() -> Any:
            nonlocal attempts, middle_headers
            attempts += 1
            if inner is not None:
                # A second loop in the same process, with its own request.
                h: Dict[str, str] = {}
                return inner.retry(headers=h)(lambda: get(bottom.url, h))()
            try:
                r = get(middle.url if middle else bottom.url, headers)
            except urllib.error.HTTPError as e:
                if middle:
                    middle_headers = signals(e.headers)
                raise
            if middle:
                middle_headers = signals(r.headers)
            return r

        reason = "success"
        try:
            top.retry(headers=headers)(call)()
        except RetryError as e:
            reason = e.reason
        got: Dict[str, Any] = {"reason": reason, "attempts": attempts, "bottom_calls": bottom.calls(),
                               "bottom_seen": bottom.seen}
        if middle:
            got["middle_calls"] = middle.count
            got["middle_headers"] = middle_headers
        return got
    finally:
        top.close()
        if inner is not None:
            inner.close()
        if middle is not None:
            middle.close()
        bottom.close()


def compact(v: Dict[str, Any]) -> Dict[str, Any]:
    """Zero values left out, as the generator's JSON omits them."""
    return {k: x for k, x in v.items() if x not in (0, None, [], {})}


@pytest.mark.parametrize("c", FILE["cases"], ids=[c["name"] for c in FILE["cases"]])
def test_layer_case(c):
    assert compact(run(c)) == compact(c["expect"])
