"""Retry at one layer (docs/layers.md) in Python: @policy.retry gives up at
once on a failure a layer below already retried (a nested loop's
RetryError, a response with Backstop-No-Retry or X-Envoy-Overloaded), sends
the attempt number (current_attempt, attempt_headers,
grpc_attempt_metadata, the headers option, httpx_attempt_hook), and
OneLayerWSGI / OneLayerASGI answer "do not retry" for a service whose own
retries cannot help. Real loopback servers (wsgiref) and urllib; the ASGI
middleware in process (no ASGI server is installed)."""
import asyncio
import threading
from types import SimpleNamespace
from typing import Any, Callable, Dict, Iterable, List

import pytest

import backstop
from backstop import (OneLayerASGI, OneLayerWSGI, RetryError, attempt_headers, current_attempt, grpc_attempt_metadata,
                      httpx_attempt_hook)
from backstop._retry import CircuitOpenError

from loopback import Scripted, Served, answer, get, status_line

# 3 attempts, 1 ms apart, no jitter.
FAST = {"max_attempts": 3, "backoff": {"strategy": "constant", "base": "1ms", "cap": "1ms"}, "jitter": {"mode": "none"}}
BREAKER = {**FAST, "circuit_breaker": {"failure_threshold": 1, "open_for": "1h"}}


@pytest.fixture(scope="module")
def policy():
    with backstop.load_policy(FAST) as p:
        yield p


@pytest.fixture
def open_breaker():
    """A policy whose breaker is open: one 503 decided on it."""
    with backstop.load_policy(BREAKER) as p:
        p.decide(attempt=1, http_status=503)
        assert p.circuit_state() == "open"
        yield p


@pytest.fixture
def cold():
    """FAST, but retrying what a layer below gave up on."""
    with backstop.load_policy({**FAST, "retried_downstream": "retry"}) as p:
        yield p


class HTTPError(Exception):
    """An HTTP client's status error (requests, httpx): .response.status_code
    and .response.headers."""

    def __init__(self, status: int, headers: Any = None) -> None:
        super().__init__("HTTP %d" % status)
        self.response = SimpleNamespace(status_code=status, headers=headers if headers is not None else {})


def fail(exc: BaseException) -> Callable[[], Any]:
    def f() -> Any:
        raise exc
    return f


# -- decide: the two inputs ----------------------------------------------------------


def test_decide_takes_retried_downstream_and_server_declined_booleans_only(policy):
    f = {"attempt": 1, "http_status": 503, "random": 0.5}
    assert policy.decide(f, retried_downstream=True).reason == "retried_downstream"
    assert policy.decide(f, server_declined=True).reason == "server_declined"
    assert policy.decide(f, retried_downstream=False, server_declined=None).reason == "transient"
    with pytest.raises(backstop.InputError) as e:
        policy.decide(f, server_declined=1, retried_downstream="yes")
    assert str(e.value) == "retried_downstream: must be a boolean (got a string)"
    assert [d.reason for d in policy.decide_many([{**f, "retried_downstream": True}, {**f, "server_declined": True}])] == [
        "retried_downstream", "server_declined"]


# -- @policy.retry: a layer below gave up ----------------------------------------------


def nested(outer_policy: Any, inner_policy: Any, exc: BaseException) -> Any:
    """An outer loop whose function is an inner loop of a call raising exc:
    its RetryError and the calls of each loop."""
    calls = {"outer": 0, "inner": 0}

    @outer_policy.retry
    def outer() -> Any:
        calls["outer"] += 1

        @inner_policy.retry
        def inner() -> Any:
            calls["inner"] += 1
            raise exc
        return inner()

    with pytest.raises(RetryError) as e:
        outer()
    return e.value, calls["outer"], calls["inner"]


def test_a_nested_loop_that_gave_up_stops_the_outer_one_at_once(policy):
    err, outer, inner = nested(policy, policy, HTTPError(503))
    assert (err.reason, err.attempts, err.decision.klass, outer, inner) == ("retried_downstream", 1, "retryable", 1, 3)
    assert err.last_exception.reason == "max_attempts_reached"
    # The classification comes first: a permanent failure is permanent_error, whoever gave up.
    err, outer, inner = nested(policy, policy, HTTPError(404))
    assert (err.reason, outer, inner) == ("permanent_error", 1, 1)


def test_async_nested_loops_too(policy):
    calls: List[int] = []

    @policy.retry
    async def outer() -> Any:
        @policy.retry
        async def inner() -> Any:
            calls.append(current_attempt())
            raise HTTPError(503)
        return await inner()

    with pytest.raises(RetryError) as e:
        asyncio.run(outer())
    assert (e.value.reason, e.value.attempts, calls) == ("retried_downstream", 1, [1, 2, 3])


def test_a_nested_loop_refused_by_its_breaker_is_retried_as_what_it_says(policy, open_breaker):
    # circuit_open: no call made, so nothing was retried below.
    outer = backstop.load_policy(FAST)
    classify = {CircuitOpenError: {"http_status": 503}}
    calls = []

    @outer.retry(classify=classify)
    def f() -> Any:
        calls.append(1)
        return open_breaker.retry(fail(AssertionError("the breaker is open: no call")))()

    with pytest.raises(RetryError) as e:
        f()
    outer.close()
    assert (e.value.reason, e.value.attempts, len(calls)) == ("max_attempts_reached", 3, 3)
    assert e.value.last_exception.reason == "circuit_open"
    assert backstop.describe(e.value.last_exception) == {}  # unmarked


def test_describe_marks_a_retry_error_by_its_last_exception(policy):
    with pytest.raises(RetryError) as e:
        policy.retry(fail(HTTPError(503, {"Retry-After": "1"})))()
    assert backstop.describe(e.value) == {"http_status": 503, "retry_after": "1", "retried_downstream": True}


def test_with_retried_downstream_retry_the_policy_retries_it(policy, cold):
    err, outer, inner = nested(cold, policy, HTTPError(503))
    assert (err.reason, outer, inner) == ("max_attempts_reached", 3, 9)
    with Scripted([{"status": 503, "headers": {"Backstop-No-Retry": "max_attempts_reached"}}]) as bottom:
        with pytest.raises(RetryError) as e:
            cold.retry(lambda: get(bottom.url))()
        assert (e.value.reason, bottom.calls()) == ("max_attempts_reached", 3)


@pytest.mark.parametrize("headers,reason", [
    ({"Backstop-No-Retry": "max_attempts_reached"}, "retried_downstream"),
    ({"backstop-no-retry": "budget_exhausted"}, "retried_downstream"),
    ({"X-Envoy-Overloaded": "true"}, "server_declined"),
    ({"Retry-After": "0"}, "max_attempts_reached"),
    ({"Backstop-No-Retry": ""}, "max_attempts_reached"),  # empty: absent, as Go's Header.Get reads it
])
def test_a_response_with_backstop_no_retry_or_x_envoy_overloaded_stops_the_loop(policy, headers, reason):
    calls = 1 if reason != "max_attempts_reached" else 3
    # urllib's HTTPError over a real server (.code, .headers)
    with Scripted([{"status": 503, "headers": headers}]) as bottom:
        with pytest.raises(RetryError) as e:
            policy.retry(lambda: get(bottom.url))()
        assert (e.value.reason, bottom.calls()) == (reason, calls)
    # a requests/httpx-like error (.response.status_code, .response.headers)
    n = []

    def f() -> Any:
        n.append(1)
        raise HTTPError(503, headers)
    with pytest.raises(RetryError) as e:
        policy.retry(f)()
    assert (e.value.reason, len(n)) == (reason, calls)


# -- the attempt number and headers ----------------------------------------------------


def test_the_headers_option_sets_the_attempt_headers_before_each_attempt(policy):
    with Scripted([{"status": 503}, {"status": 503}, {"status": 200}]) as bottom:
        headers = {"accept": "text/plain"}
        r = policy.retry(headers=headers)(lambda: get(bottom.url, headers))()
        assert r.status == 200
        assert bottom.seen == [attempt_headers(n) for n in (1, 2, 3)]
    # Taken away when the loop ends: the caller's mapping is as it was.
    assert headers == {"accept": "text/plain"}


def test_the_headers_option_keeps_what_the_caller_set(policy):
    with Scripted([{"status": 503}]) as bottom:
        headers = {"Backstop-Attempt": "7"}
        with pytest.raises(RetryError):
            policy.retry(headers=headers)(lambda: get(bottom.url, headers))()
        assert bottom.seen == [{"backstop-attempt": "7", "x-envoy-attempt-count": str(n)} for n in (1, 2, 3)]
    assert headers == {"Backstop-Attempt": "7"}


def test_a_decorated_function_with_headers_counts_from_1_on_every_call(policy):
    headers: Dict[str, str] = {}
    seen = []

    @policy.retry(headers=headers)
    def f() -> None:
        seen.append(dict(headers))
        if len(seen) % 2:
            raise HTTPError(503)

    f()
    f()
    assert seen == [attempt_headers(1), attempt_headers(2)] * 2


def test_async_headers_and_attempts_per_task(policy):
    async def main() -> Any:
        async def one(tag: str) -> List[Any]:
            headers = {"x-tag": tag}
            seen = []

            @policy.retry(headers=headers)
            async def f() -> None:
                seen.append((current_attempt(), headers.get("backstop-attempt")))
                await asyncio.sleep(0)  # the other task runs in between
                if current_attempt() < 3:
                    raise HTTPError(503)
            await f()
            return seen
        return await asyncio.gather(one("a"), one("b"))

    a, b = asyncio.run(main())
    assert a == b == [(1, "1"), (2, "2"), (3, "3")]


def test_the_headers_option_must_be_a_mutable_mapping(policy):
    for bad in ("backstop-attempt: 1", [], 1, frozenset()):
        with pytest.raises(TypeError, match="headers must be a mutable mapping"):
            policy.retry(headers=bad)


def test_current_attempt_and_nested_loops(policy):
    seen = []
    assert current_attempt() == 0 and attempt_headers() == {} and grpc_attempt_metadata() == ()

    @policy.retry
    def outer() -> None:
        seen.append(("outer", current_attempt()))

        @policy.retry
        def inner() -> None:
            seen.append(("inner", current_attempt(), grpc_attempt_metadata()))
            if current_attempt() < 2:
                raise HTTPError(503)
        inner()
        seen.append(("outer again", current_attempt(), attempt_headers()))
        if current_attempt() < 2:
            raise ConnectionResetError()  # not a RetryError: the outer loop retries it

    outer()
    assert seen == [
        ("outer", 1), ("inner", 1, (("backstop-attempt", "1"),)),
        ("inner", 2, (("backstop-attempt", "2"), ("grpc-previous-rpc-attempts", "1"))),
        ("outer again", 1, attempt_headers(1)),
        ("outer", 2), ("inner", 1, (("backstop-attempt", "1"),)),
        ("inner", 2, (("backstop-attempt", "2"), ("grpc-previous-rpc-attempts", "1"))),
        ("outer again", 2, {"backstop-attempt": "2", "x-envoy-attempt-count": "2"}),
    ]
    assert current_attempt() == 0


def test_attempt_headers_and_grpc_attempt_metadata_of_a_number():
    assert attempt_headers(12) == {"backstop-attempt": "12", "x-envoy-attempt-count": "12"}
    assert grpc_attempt_metadata(1) == (("backstop-attempt", "1"),)
    assert grpc_attempt_metadata(3) == (("backstop-attempt", "3"), ("grpc-previous-rpc-attempts", "2"))
    for bad in (0, -1, 1.5, "2", True):
        with pytest.raises(TypeError):
            attempt_headers(bad)
        with pytest.raises(TypeError):
            grpc_attempt_metadata(bad)


class Headers(dict):
    """httpx.Headers' part the hook uses: case-insensitive `in`."""

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and any(k.lower() == name.lower() for k in self)


def test_httpx_attempt_hook_sync_and_async(policy):
    # Outside a loop: nothing.
    req = SimpleNamespace(headers=Headers())
    httpx_attempt_hook(req)
    assert req.headers == {}
    requests: List[Any] = []

    @policy.retry
    def send() -> None:
        r = SimpleNamespace(headers=Headers({"X-Envoy-Attempt-Count": "9"}))
        httpx_attempt_hook(r)  # httpx.Client ignores what it returns
        requests.append(r.headers)
        if len(requests) < 2:
            raise HTTPError(503)

    send()
    assert requests == [{"X-Envoy-Attempt-Count": "9", "backstop-attempt": str(n)} for n in (1, 2)]

    @policy.retry
    async def asend() -> Any:
        r = SimpleNamespace(headers=Headers())
        await httpx_attempt_hook(r)  # httpx.AsyncClient awaits it
        return r.headers

    assert asyncio.run(asend()) == attempt_headers(1)


# -- OneLayerWSGI ----------------------------------------------------------------------


def ok_app(runs: List[int]) -> Callable[..., Iterable[bytes]]:
    def app(environ: Dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        runs.append(1)
        start_response("200 OK", [("content-type", "text/plain")])
        return [b"ok"]
    return app


def test_wsgi_sheds_while_a_breaker_is_open_without_running_the_app(policy, open_breaker):
    runs: List[int] = []
    with Served(OneLayerWSGI(ok_app(runs), policies=[policy, open_breaker])) as srv:
        r = answer(srv.url)
        assert (r["status"], r["signals"]) == (503, {"backstop-no-retry": "circuit_open", "x-envoy-overloaded": "true"})
        assert b"circuit breaker open" in r["body"]
        # A caller's loop gives up at once on it.
        with pytest.raises(RetryError) as e:
            policy.retry(lambda: get(srv.url))()
        assert (e.value.reason, e.value.attempts, runs) == ("retried_downstream", 1, [])


def test_wsgi_runs_the_app_when_no_breaker_is_open_and_an_empty_budget_sheds_nothing(policy):
    budget = backstop.load_policy({**FAST, "retry_budget": {"type": "token_bucket", "max_tokens": 2, "token_ratio": 0.1}})
    closed = backstop.load_policy(BREAKER)
    for _ in range(3):
        budget.decide(attempt=1, http_status=503)
    assert budget.decide(attempt=1, http_status=503).reason == "budget_exhausted"
    runs: List[int] = []
    with Served(OneLayerWSGI(ok_app(runs), policies=[policy, closed, budget])) as srv:
        assert answer(srv.url) == {"status": 200, "signals": {}, "body": b"ok"}
    assert runs == [1]
    budget.close()
    closed.close()


def looping(fn: Callable[[], Any], loop_policy: Any, status: int = 502, lazy: bool = False) -> Callable[..., Any]:
    """A WSGI app whose @policy.retry loop calls fn: it answers status when
    the loop gave up, 200 on success; lazy: a generator, whose loop runs
    (and start_response is called) when the server iterates it."""
    def code() -> int:
        try:
            loop_policy.retry(fn)()
            return 200
        except RetryError:
            return status

    def app(environ: Dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if lazy:
            def body() -> Iterable[bytes]:
                start_response(status_line(code()), [])
                yield b"n"
                yield b"o"
            return body()
        start_response(status_line(code()), [("content-type", "text/plain")])
        return [b"no"]
    return app


@pytest.mark.parametrize("lazy", [False, True], ids=["list", "generator"])
def test_wsgi_marks_a_failed_response_with_the_reason_of_a_loop_that_gave_up(policy, open_breaker, lazy):
    with Served(OneLayerWSGI(looping(fail(HTTPError(503)), policy, lazy=lazy))) as srv:
        r = answer(srv.url)
    assert (r["status"], r["signals"], r["body"]) == (502, {"backstop-no-retry": "max_attempts_reached"}, b"no")
    # Any reason: a permanent error, a breaker refusing the call (a policy not in policies).
    with Served(OneLayerWSGI(looping(fail(HTTPError(404)), policy, status=404, lazy=lazy))) as srv:
        assert answer(srv.url)["signals"] == {"backstop-no-retry": "permanent_error"}
    with Served(OneLayerWSGI(looping(fail(AssertionError("no call")), open_breaker, status=503, lazy=lazy))) as srv:
        assert answer(srv.url)["signals"] == {"backstop-no-retry": "circuit_open"}


def test_wsgi_adds_nothing_on_success_when_no_loop_gave_up_or_when_the_app_set_it(policy):
    # The loop gave up, but the app answers 200.
    with Served(OneLayerWSGI(looping(fail(HTTPError(503)), policy, status=200))) as srv:
        assert answer(srv.url)["signals"] == {}

    # A loop that succeeded, then a 500 of the app's own.
    def own(environ: Dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        policy.retry(lambda: "ok")()
        start_response("500 Internal Server Error", [])
        return [b""]
    with Served(OneLayerWSGI(own)) as srv:
        assert answer(srv.url) == {"status": 500, "signals": {}, "body": b""}

    # The app's own value wins.
    def mine(environ: Dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        with pytest.raises(RetryError):
            policy.retry(fail(HTTPError(503)))()
        start_response("503 Service Unavailable", [("Backstop-No-Retry", "mine")])
        return [b""]
    with Served(OneLayerWSGI(mine)) as srv:
        assert answer(srv.url)["signals"] == {"backstop-no-retry": "mine"}


def test_wsgi_keeps_each_request_to_its_own_loops(policy):
    # Two requests at once (one thread each): the one whose loop gave up is marked, the other not.
    release = threading.Event()

    def app(environ: Dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        failing = environ["PATH_INFO"] == "/fail"
        try:
            policy.retry(fail(HTTPError(503)) if failing else (lambda: "ok"))()
        except RetryError:
            pass
        if failing:
            release.wait(10)
        else:
            release.set()
        start_response("500 Internal Server Error", [])
        return [b""]

    with Served(OneLayerWSGI(app)) as srv:
        out: Dict[str, Any] = {}
        t = threading.Thread(target=lambda: out.update(fail=answer(srv.url + "fail")))
        t.start()
        ok = answer(srv.url + "ok")
        t.join(10)
    assert (out["fail"]["signals"], ok["signals"]) == ({"backstop-no-retry": "max_attempts_reached"}, {})
    # Outside a request, a loop that gives up records nothing anywhere.
    with pytest.raises(RetryError):
        policy.retry(fail(HTTPError(503)))()


def test_the_middleware_checks_its_arguments(policy):
    for cls in (OneLayerWSGI, OneLayerASGI):
        with pytest.raises(TypeError):
            cls("app")
        with pytest.raises(TypeError, match="policies must be a list of Policy"):
            cls(ok_app([]), policies=policy)
        with pytest.raises(TypeError, match="policies must be a list of Policy"):
            cls(ok_app([]), policies=[{}])


# -- OneLayerASGI (in process) -----------------------------------------------------------


async def asgi_call(app: Any, scope_type: str = "http") -> Dict[str, Any]:
    """Runs one request through an ASGI app: the status, the retry signals
    and the body it sent."""
    sent: List[Dict[str, Any]] = []

    async def receive() -> Dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Dict[str, Any]) -> None:
        sent.append(message)

    await app({"type": scope_type, "method": "GET", "path": "/", "headers": []}, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    headers = {bytes(k).decode().lower(): bytes(v).decode() for k, v in start.get("headers", [])}
    signals = {k: v for k, v in headers.items() if k in ("backstop-no-retry", "x-envoy-overloaded")}
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return {"status": start["status"], "signals": signals, "body": body}


def asgi_app(handler: Callable[[], Any], runs: List[int]) -> Any:
    """An ASGI app: it awaits handler() for its (status, headers)."""
    async def app(scope: Dict[str, Any], receive: Any, send: Any) -> None:
        runs.append(1)
        status, headers = await handler()
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"done"})
    return app


def test_asgi_sheds_while_a_breaker_is_open(policy, open_breaker):
    runs: List[int] = []

    async def handler() -> Any:
        return 200, []
    r = asyncio.run(asgi_call(OneLayerASGI(asgi_app(handler, runs), policies=[policy, open_breaker])))
    assert (r["status"], r["signals"], runs) == (503, {"backstop-no-retry": "circuit_open", "x-envoy-overloaded": "true"}, [])
    assert b"circuit breaker open" in r["body"]
    r = asyncio.run(asgi_call(OneLayerASGI(asgi_app(handler, runs), policies=[policy])))
    assert (r["status"], r["signals"], runs) == (200, {}, [1])


def test_asgi_marks_a_failed_response_after_a_loop_gave_up(policy):
    runs: List[int] = []

    def gave_up(status: int, headers: Any = (), fail_with: Any = HTTPError(503), in_thread: bool = False) -> Any:
        async def handler() -> Any:
            @policy.retry
            async def call() -> None:
                raise fail_with

            def sync_call() -> None:
                policy.retry(fail(fail_with))()
            try:
                # asyncio.to_thread copies the context, as a framework's thread pool does.
                await (asyncio.to_thread(sync_call) if in_thread else call())
            except RetryError:
                pass
            return status, list(headers)
        return OneLayerASGI(asgi_app(handler, runs))

    assert asyncio.run(asgi_call(gave_up(502)))["signals"] == {"backstop-no-retry": "max_attempts_reached"}
    assert asyncio.run(asgi_call(gave_up(502, in_thread=True)))["signals"] == {"backstop-no-retry": "max_attempts_reached"}
    assert asyncio.run(asgi_call(gave_up(404, fail_with=HTTPError(404))))["signals"] == {"backstop-no-retry": "permanent_error"}
    # None on success, and the app's own value wins.
    assert asyncio.run(asgi_call(gave_up(200)))["signals"] == {}
    own = asyncio.run(asgi_call(gave_up(503, headers=[(b"Backstop-No-Retry", b"mine")])))
    assert own["signals"] == {"backstop-no-retry": "mine"}

    # No loop gave up: a 500 of the app's own is not marked.
    async def plain() -> Any:
        return 500, []
    assert asyncio.run(asgi_call(OneLayerASGI(asgi_app(plain, runs))))["signals"] == {}


def test_asgi_passes_other_scopes_through(open_breaker):
    runs: List[int] = []

    async def handler() -> Any:
        return 200, []
    # The breaker is open, but a websocket (or lifespan) scope is not HTTP: passed through.
    r = asyncio.run(asgi_call(OneLayerASGI(asgi_app(handler, runs), policies=[open_breaker]), scope_type="websocket"))
    assert (r["status"], runs) == (200, [1])


# -- three layers ----------------------------------------------------------------------


def test_three_layers_over_loopback_the_bottom_gets_at_most_one_layers_attempts(policy, cold):
    # top @policy.retry -> middle (OneLayerWSGI, its loop calls the bottom) -> a flaky bottom.
    with Scripted([{"status": 503}]) as bottom:
        middle_calls: List[int] = []

        def middle_app(environ: Dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            middle_calls.append(1)
            headers: Dict[str, str] = {}
            try:
                policy.retry(headers=headers)(lambda: get(bottom.url, headers))()
                code = 200
            except RetryError as e:
                code = e.last_exception.code
            start_response(status_line(code), [])
            return [b""]

        with Served(OneLayerWSGI(middle_app, policies=[policy])) as middle:
            top: List[int] = []
            headers: Dict[str, str] = {}

            def call() -> Any:
                top.append(1)
                return get(middle.url, headers)
            with pytest.raises(RetryError) as e:
                policy.retry(headers=headers)(call)()
            assert e.value.reason == "retried_downstream"
            assert e.value.last_exception.headers["Backstop-No-Retry"] == "max_attempts_reached"
            assert (len(top), len(middle_calls), bottom.calls()) == (1, 1, 3)
            assert bottom.seen == [attempt_headers(n) for n in (1, 2, 3)]

            # Without the rule (every layer retries), the same stack multiplies the calls.
            before = bottom.calls()
            with pytest.raises(RetryError):
                cold.retry(lambda: get(middle.url))()
            assert bottom.calls() - before == 9
