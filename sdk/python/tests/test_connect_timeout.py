"""connect_timeout (issue 43): the policy's connect bound, read from the
module once, handed to httpx, against a real peer on loopback that never
completes a connect (loopback.blackhole). A connect that runs out is the
error kind connect_timeout, not timeout, and a POST that never connected is
retried (never sent)."""

import asyncio

import httpx
import pytest

import backstop
import backstop._retry as retry_mod
from backstop import RetryError, describe

from loopback import blackhole

POLICY = {"max_attempts": 2, "attempt_timeout": "30s", "connect_timeout": "100ms",
          "backoff": {"strategy": "constant", "base": "1ms"}, "jitter": {"mode": "none"}}


@pytest.fixture
def peer(monkeypatch):
    monkeypatch.setattr(retry_mod, "_sleep", lambda s: None)

    async def no_sleep(s):
        pass

    monkeypatch.setattr(retry_mod, "_async_sleep", no_sleep)
    addr, close = blackhole()
    yield addr
    close()


def test_connect_timeout_is_read_from_the_policy():
    with backstop.load_policy(POLICY) as p:
        assert p.connect_timeout == 0.1
    with backstop.load_policy({"max_attempts": 2}) as p:
        assert p.connect_timeout is None  # the client's own


def check(e, calls):
    assert e.value.reason == "max_attempts_reached" and e.value.attempts == 2 and calls == [1, 2], (e.value, calls)
    assert isinstance(e.value.last_exception, httpx.ConnectTimeout), repr(e.value.last_exception)
    assert describe(e.value.last_exception)["error_kind"] == "connect_timeout"


def test_httpx_connect_timeout(peer):
    with backstop.load_policy(POLICY) as p:
        calls = []
        client = httpx.Client(timeout=httpx.Timeout(30, connect=p.connect_timeout), trust_env=False)

        @p.retry(method="POST")
        def charge():
            calls.append(len(calls) + 1)
            return client.post("http://%s/charge" % peer)

        with client, pytest.raises(RetryError) as e:
            charge()
        check(e, calls)


def test_httpx_connect_timeout_async(peer):
    with backstop.load_policy(POLICY) as p:
        calls = []

        async def run():
            async with httpx.AsyncClient(timeout=httpx.Timeout(30, connect=p.connect_timeout), trust_env=False) as client:
                @p.retry(method="POST")
                async def charge():
                    calls.append(len(calls) + 1)
                    return await client.post("http://%s/charge" % peer)

                await charge()

        with pytest.raises(RetryError) as e:
            asyncio.run(run())
        check(e, calls)
