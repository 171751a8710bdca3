"""Policy.retry against a real local HTTP server. Tests never sleep: the
sleeps are replaced, and only the decided delays are checked."""

import asyncio
import errno
import socket
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import backstop
import backstop._retry as retry_mod
from backstop import RetryError, describe

# Deterministic delays: 250 ms, no jitter, three attempts.
FIXED = {"max_attempts": 3, "backoff": {"strategy": "constant", "base": "250ms", "cap": "1s"}, "jitter": {"mode": "none"}}


@pytest.fixture
def policy():
    with backstop.load_policy(FIXED) as p:
        yield p


@pytest.fixture
def sleeps(monkeypatch):
    calls = []
    monkeypatch.setattr(retry_mod, "_sleep", calls.append)

    async def fake_async_sleep(s):
        calls.append(s)

    monkeypatch.setattr(retry_mod, "_async_sleep", fake_async_sleep)
    return calls


class Server:
    """An HTTP server on 127.0.0.1 answering each path from a script of
    (status, headers) steps; the last step repeats."""

    def __init__(self):
        self.script = {}
        self.hits = {}
        self.methods = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                outer.hits[self.path] = outer.hits.get(self.path, 0) + 1
                outer.methods.append(self.command)
                steps = outer.script[self.path]
                status, headers = steps.pop(0) if len(steps) > 1 else steps[0]
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            do_POST = do_GET

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, args=(0.01,), daemon=True).start()

    def on(self, path, *steps):
        self.script[path] = [s if isinstance(s, tuple) else (s, {}) for s in steps]
        return self.url + path


@pytest.fixture
def server():
    s = Server()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


def get(url, method="GET", data=None):
    with urllib.request.urlopen(urllib.request.Request(url, method=method, data=data), timeout=10) as r:
        return r.read()


def test_retries_503_then_succeeds(policy, server, sleeps):
    url = server.on("/flaky", 503, 503, 200)
    states = []
    fetch = policy.retry(before_sleep=states.append)(get)
    assert fetch(url) == b"ok"
    assert server.hits["/flaky"] == 3
    assert sleeps == [0.25, 0.25]
    assert [(s.attempt, s.decision.reason, s.decision.delay_ms) for s in states] == [(1, "transient", 250), (2, "transient", 250)]
    assert isinstance(states[0].exception, urllib.error.HTTPError) and states[0].exception.code == 503


def test_never_retries_400(policy, server, sleeps):
    url = server.on("/bad", 400)
    with pytest.raises(RetryError) as e:
        policy.retry(get)(url)
    assert (e.value.reason, e.value.attempts) == ("permanent_error", 1)
    assert e.value.last_exception.code == 400
    assert e.value.__cause__ is e.value.last_exception
    assert server.hits["/bad"] == 1 and sleeps == []


def test_honours_retry_after(policy, server, sleeps):
    url = server.on("/limited", (429, {"Retry-After": "7"}), 200)
    states = []
    assert policy.retry(before_sleep=states.append)(get)(url) == b"ok"
    assert [(s.decision.reason, s.decision.delay_ms) for s in states] == [("retry_after", 7000)]
    assert sleeps == [7.0]


def test_gives_up_at_max_attempts(policy, server, sleeps):
    url = server.on("/down", 503)
    with pytest.raises(RetryError) as e:
        policy.retry(get)(url)
    assert (e.value.reason, e.value.attempts) == ("max_attempts_reached", 3)
    assert e.value.decision.action == "dead_letter"
    assert "gave up after 3 attempts (max_attempts_reached)" in str(e.value)
    assert server.hits["/down"] == 3 and sleeps == [0.25, 0.25]


def test_post_without_idempotency_key_is_not_retried(policy, server, sleeps):
    url = server.on("/post", 503, 200)
    with pytest.raises(RetryError) as e:
        policy.retry(method="POST")(get)(url, "POST", b"{}")
    assert (e.value.reason, e.value.attempts) == ("not_idempotent", 1)
    assert server.hits["/post"] == 1


def test_post_with_idempotency_key_is_retried(policy, server, sleeps):
    url = server.on("/post", 503, 200)
    assert policy.retry(method="POST", idempotency_key="order-42")(get)(url, "POST", b"{}") == b"ok"
    assert server.methods == ["POST", "POST"] and sleeps == [0.25]


def test_connection_refused_is_retried_even_for_post(policy, sleeps):
    # The request never left: the idempotency gate lets it through.
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    states = []
    with pytest.raises(RetryError) as e:
        policy.retry(method="POST", before_sleep=states.append)(get)("http://127.0.0.1:%d/" % port, "POST", b"")
    assert e.value.reason == "max_attempts_reached"
    assert states[0].decision.klass == "retryable"


def test_success_is_recorded(policy, server, sleeps, monkeypatch):
    url = server.on("/ok", 200)
    calls = []
    monkeypatch.setattr(policy, "record_success", lambda now_ms=None: calls.append(now_ms))
    policy.retry(get)(url)
    assert calls == [None]


def test_success_closes_a_real_breaker(server, sleeps):
    with backstop.load_policy({"max_attempts": 5, "circuit_breaker": {"failure_threshold": 2, "open_for": "1h"}}) as p:
        url = server.on("/x", 503, 200, 503, 200)
        fetch = p.retry(get)
        fetch(url)
        fetch(url)  # without the success in between, the second 503 would open the breaker
        assert p.circuit_state() == "closed"


def test_classify_mapping_and_function(policy, sleeps):
    class Flaky(Exception):
        pass

    class Broken(Flaky):
        pass

    attempts = []

    def fail(exc):
        def f():
            attempts.append(1)
            raise exc
        return f

    classify = {Flaky: "retryable", Broken: "permanent", KeyError: "connection_refused"}
    with pytest.raises(RetryError) as e:
        policy.retry(classify=classify)(fail(Flaky()))()
    assert e.value.reason == "max_attempts_reached" and len(attempts) == 3
    with pytest.raises(RetryError) as e:
        policy.retry(classify=classify)(fail(Broken()))()  # the most specific type wins
    assert (e.value.reason, e.value.attempts) == ("permanent_error", 1)
    states = []
    with pytest.raises(RetryError):
        policy.retry(classify=classify, before_sleep=states.append)(fail(KeyError("k")))()
    assert states[0].decision.klass == "retryable"

    def by_function(exc):
        return {"http_status": 429, "retry_after": "9"} if isinstance(exc, ValueError) else None

    states.clear()
    with pytest.raises(RetryError):
        policy.retry(classify=by_function, before_sleep=states.append)(fail(ValueError()))()
    assert states[0].decision.delay_ms == 9000


def test_unknown_exceptions_follow_the_policy_default(policy, sleeps):
    calls = []

    def bug():
        calls.append(1)
        raise RuntimeError("?")

    with pytest.raises(RetryError) as e:
        policy.retry(bug)()
    assert e.value.decision.klass == "uncertain"


def test_base_exceptions_propagate(policy, sleeps):
    @policy.retry
    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        interrupted()
    assert sleeps == []


def test_options_are_validated(policy):
    with pytest.raises(TypeError, match="before_sleep"):
        policy.retry(before_sleep=3)
    with pytest.raises(TypeError, match="classify keys"):
        policy.retry(classify={"x": "retryable"})
    with pytest.raises(TypeError, match="method"):
        policy.retry(method=1)
    with pytest.raises(TypeError, match="reraise must be True or False"):
        policy.retry(reraise="yes")


# reraise=True (tenacity's): the give-up raises the last attempt's own
# exception, not RetryError, after the same attempts and sleeps.
def test_reraise_raises_the_original_exception(policy, server, sleeps):
    url = server.on("/down", 503)
    with pytest.raises(urllib.error.HTTPError) as e:
        policy.retry(reraise=True)(get)(url)
    assert e.value.code == 503 and not isinstance(e.value, RetryError)
    assert server.hits["/down"] == 3 and sleeps == [0.25, 0.25]
    url = server.on("/bad", 400)  # a permanent error: at once, as itself
    with pytest.raises(urllib.error.HTTPError) as e:
        policy.retry(reraise=True)(get)(url)
    assert e.value.code == 400 and server.hits["/bad"] == 1


def test_reraise_async(policy, sleeps):
    errors = []

    @policy.retry(reraise=True)
    async def down():
        errors.append(ConnectionResetError(errno.ECONNRESET, "reset %d" % len(errors)))
        raise errors[-1]

    with pytest.raises(ConnectionResetError) as e:
        asyncio.run(down())
    assert e.value is errors[-1] and len(errors) == 3 and sleeps == [0.25, 0.25]


def test_reraise_keeps_retry_error_for_a_refused_call(server, sleeps):
    # A breaker's refusal is no exception of the function's to raise.
    with backstop.load_policy({"max_attempts": 1, "circuit_breaker": {"failure_threshold": 1, "open_for": "1h"}}) as p:
        url = server.on("/down", 503)
        with pytest.raises(urllib.error.HTTPError):
            p.retry(reraise=True)(get)(url)
        with pytest.raises(RetryError) as e:
            p.retry(reraise=True)(get)(url)
        assert e.value.reason == "circuit_open" and server.hits["/down"] == 1


def test_async_retries_and_awaits_before_sleep(policy, server, sleeps):
    url = server.on("/flaky", 503, (429, {"Retry-After": "2"}), 200)
    states = []

    async def before(state):
        states.append(state.decision.delay_ms)

    @policy.retry(before_sleep=before)
    async def fetch():
        return await asyncio.get_running_loop().run_in_executor(None, get, url)

    assert asyncio.run(fetch()) == b"ok"
    assert states == [250, 2000] and sleeps == [0.25, 2.0]


def test_async_gives_up_with_the_last_exception(policy, sleeps):
    @policy.retry
    async def down():
        raise ConnectionResetError(errno.ECONNRESET, "reset")

    with pytest.raises(RetryError) as e:
        asyncio.run(down())
    assert e.value.reason == "max_attempts_reached" and isinstance(e.value.last_exception, ConnectionResetError)


def test_async_cancellation_stops_the_wait():
    # A real asyncio.sleep of an hour: cancelling the task must end it at once.
    slow = {"max_attempts": 3, "backoff": {"strategy": "constant", "base": "1h", "cap": "1h"}, "jitter": {"mode": "none"}}
    calls = []

    async def main():
        waiting = asyncio.Event()
        with backstop.load_policy(slow) as p:
            @p.retry(before_sleep=lambda s: waiting.set())
            async def flaky():
                calls.append(1)
                raise TimeoutError

            task = asyncio.create_task(flaky())
            await waiting.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, 60)  # 60 s only guards against a hang

    asyncio.run(main())
    assert calls == [1]


# -- the built-in classification -------------------------------------------


class _Resp:
    def __init__(self, status, headers=None, request=None):
        self.status_code, self.headers, self.request = status, headers or {}, request


class _Req:
    def __init__(self, method, headers=None):
        self.method, self.headers = method, headers or {}


class HTTPError(Exception):  # requests-like
    def __init__(self, response, request=None):
        super().__init__("status error")
        self.response, self.request = response, request


class HTTPStatusError(Exception):  # httpx-like: .request raises when unset
    def __init__(self, response):
        super().__init__("status error")
        self.response = response

    @property
    def request(self):
        raise RuntimeError("The .request property has not been set.")


class _Code:
    value = (14, "unavailable")


class RpcError(Exception):  # grpc-like
    def code(self):
        return _Code()

    def trailing_metadata(self):
        return (("grpc-retry-pushback-ms", "250"),)


class ConnectTimeout(OSError):  # requests/httpx name
    pass


class ReadTimeout(Exception):
    pass


@pytest.mark.parametrize("exc, fields", [
    (HTTPError(_Resp(503, {"Retry-After": "5"}), _Req("POST", {"Idempotency-Key": "k"})),
     {"http_status": 503, "retry_after": "5", "method": "POST", "idempotency_key": "k"}),
    (HTTPStatusError(_Resp(429, {"retry-after": "1"})), {"http_status": 429, "retry_after": "1"}),
    (RpcError(), {"grpc_code": 14, "grpc_retry_pushback_ms": "250"}),
    (ConnectionRefusedError(), {"error_kind": "connection_refused"}),
    (ConnectionResetError(), {"error_kind": "connection_reset"}),
    (BrokenPipeError(), {"error_kind": "connection_reset"}),
    (ConnectionError(), {"error_kind": "connection_reset"}),
    (TimeoutError(), {"error_kind": "timeout"}),
    (socket.timeout(), {"error_kind": "timeout"}),
    (asyncio.TimeoutError(), {"error_kind": "timeout"}),
    (socket.gaierror(socket.EAI_AGAIN, "try again"), {"error_kind": "dns_temporary"}),
    (socket.gaierror(socket.EAI_NONAME, "unknown"), {"error_kind": "dns_not_found"}),
    (urllib.error.URLError(ConnectionRefusedError()), {"error_kind": "connection_refused"}),
    (ConnectTimeout(), {"error_kind": "connect_timeout"}),
    (ReadTimeout(), {"error_kind": "timeout"}),
    (ValueError(), {}),
], ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else "")
def test_describe(exc, fields):
    assert describe(exc) == fields


def test_describe_follows_causes():
    try:
        try:
            raise ConnectionRefusedError
        except OSError as e:
            raise RuntimeError("wrapped") from e
    except RuntimeError as e:
        assert describe(e) == {"error_kind": "connection_refused"}


# -- deadlines: the policy's attempt_timeout, and what is left of max_elapsed --------

TIMED = {"max_attempts": 3, "attempt_timeout": "50ms", "backoff": {"strategy": "constant", "base": "1ms", "cap": "1s"},
         "jitter": {"mode": "none"}}


@pytest.fixture
def release():
    """Set at the end of the test: the calls that hang until it end, and
    their abandoned threads with them."""
    e = threading.Event()
    yield e
    e.set()


def test_a_hanging_call_times_out_at_each_attempt(sleeps, release):
    calls = []

    @backstop.load_policy(TIMED).retry
    def hang():
        calls.append(threading.current_thread())
        release.wait()

    with pytest.raises(RetryError) as e:
        hang()
    assert (e.value.reason, e.value.attempts, len(calls)) == ("max_attempts_reached", 3, 3)
    last = e.value.last_exception
    assert isinstance(last, backstop.DeadlineExceeded) and isinstance(last, TimeoutError)
    assert (str(last), last.timeout, last.abandoned) == ("attempt deadline exceeded after 50ms", 0.05, True)
    assert describe(last) == {"error_kind": "timeout"} and sleeps == [0.001, 0.001]
    assert threading.current_thread() not in calls  # each attempt ran in a thread of its own


def test_a_hanging_coroutine_is_cancelled_at_each_attempt(sleeps):
    cancelled = []

    @backstop.load_policy(TIMED).retry
    async def hang():
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(backstop.current_attempt())
            raise

    with pytest.raises(RetryError) as e:
        asyncio.run(hang())
    assert (e.value.reason, e.value.attempts, cancelled) == ("max_attempts_reached", 3, [1, 2, 3])
    assert isinstance(e.value.last_exception, backstop.DeadlineExceeded)
    assert not e.value.last_exception.abandoned  # it ended when cancelled


def test_a_coroutine_ignoring_its_cancellation_is_left_behind(sleeps, release):
    async def main():
        @backstop.load_policy(dict(TIMED, max_attempts=1)).retry
        async def stubborn():
            while not release.is_set():
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    pass  # ignored

        with pytest.raises(RetryError) as e:
            await stubborn()
        assert e.value.last_exception.abandoned
        release.set()  # its next cancellation (asyncio.run's, at the end) ends it

    asyncio.run(main())


def test_the_max_elapsed_remainder_bounds_the_last_attempt(sleeps, release):
    p = backstop.load_policy(dict(TIMED, max_attempts=10, attempt_timeout="200ms", max_elapsed="300ms"))
    asked = []
    ask = p.attempt_timeout
    p.attempt_timeout = lambda elapsed_ms: asked.append(ask(elapsed_ms)) or asked[-1]

    with pytest.raises(RetryError) as e:
        p.retry(release.wait)()
    assert e.value.reason == "max_elapsed_exceeded"
    # The first attempt ran its whole 200 ms, so what was left of 300 ms bounds the next.
    assert asked[0] == 200 and all(0 < t <= 100 for t in asked[1:]) and len(asked) >= 2
    assert e.value.last_exception.timeout == asked[-1] / 1000


def test_a_call_that_ends_in_time_wins(sleeps, server):
    p = backstop.load_policy(dict(TIMED, attempt_timeout="10s"))
    url = server.on("/t", 503, 200)
    assert p.retry(get)(url) == b"ok" and sleeps == [0.001]
    with pytest.raises(RetryError) as e:
        p.retry(get)(server.on("/bad", 400))
    assert e.value.reason == "permanent_error" and e.value.last_exception.code == 400


def test_a_deadline_is_a_timeout_whatever_classify_says(sleeps, release):
    p = backstop.load_policy(TIMED)
    with pytest.raises(RetryError) as e:
        p.retry(classify={TimeoutError: "permanent"})(release.wait)()
    assert e.value.attempts == 3


def test_attempt_time_left(sleeps):
    assert backstop.attempt_time_left() is None
    seen = []

    def look():
        seen.append(backstop.attempt_time_left())

    backstop.load_policy(dict(TIMED, attempt_timeout="5s")).retry(look)()
    backstop.load_policy(FIXED).retry(look)()
    assert 0 < seen[0] <= 5 and seen[1] is None

    # A loop without a timeout inside one with: the outer deadline still holds.
    inner = backstop.load_policy(FIXED).retry(look)
    backstop.load_policy(dict(TIMED, attempt_timeout="5s")).retry(inner)()
    assert 0 < seen[2] <= 5

    async def alook():
        look()

    asyncio.run(backstop.load_policy(dict(TIMED, attempt_timeout="5s")).retry(alook)())
    assert 0 < seen[3] <= 5
    assert backstop.attempt_time_left() is None
