"""Issue 40 (SPEC-40 item 11): no error or log record of backstop.rabbitmq
(asyncio and sync) shows the password of the URL it was given, parseable or
not, whether the broker is unreachable or refuses the login. The Redis queue
and the idempotency store take a client the caller made, never a URL: they
have none to show. The session's real broker (conftest ``rabbit``) refuses
the password."""

import asyncio
import logging
import traceback

import pytest

from backstop import _redact, rabbitmq
from backstop.rabbitmq import sync

# The password in the forms a URL may carry it: as is, escaped, and those
# that make a URL parser fail or cut the host part short.
FORMS = {"plain": "hunter2-Pw0rd", "escaped": "hunter2%25Pw0rd", "unescaped %": "hunter2%Pw0rd",
         "space": "hunter2 Pw0rd", "slash": "hunter2/Pw0rd"}
LEAKS = ("hunter2", "Pw0rd")


def _text(exc: BaseException) -> str:
    """Everything an exception prints: its traceback with causes and context."""
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)) + repr(exc)


def _check(what: str, text: str) -> None:
    for leak in LEAKS:
        assert leak not in text, "%s shows %r:\n%s" % (what, leak, text)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_connect_errors_show_no_password(rabbit, caplog, form):
    caplog.set_level(logging.DEBUG)  # every library's records, aio-pika's and pika's included
    pw = FORMS[form]
    for host in ("127.0.0.1:1", "127.0.0.1:%d" % rabbit.port):
        url = "amqp://guest:%s@%s/" % (pw, host)

        async def connect_async() -> None:
            b = await rabbitmq.connect(url, timeout=10)
            await b.close()

        for name, call in (("rabbitmq.connect", lambda: asyncio.run(connect_async())),
                           ("rabbitmq.sync.connect", lambda: sync.connect(url).close())):
            with pytest.raises(Exception) as info:
                call()
            _check("%s, password %s, %s: the error" % (name, form, host), _text(info.value))
            if form == "plain" and host.endswith(str(rabbit.port)):
                assert "ACCESS_REFUSED" in _text(info.value) or "403" in _text(info.value) or \
                    "Probable" in _text(info.value), "%s: the broker did not refuse the login: %r" % (name, info.value)
    _check("the log records", caplog.text)


# The same table as Go's internal/redact TestURL: one rule in every language.
@pytest.mark.parametrize("raw, want", [
    ("", ""),
    ("redis://cache:6379/0", "redis://cache:6379/0"),
    ("redis://app:s3cret@cache:6379/0", "redis://app:xxxxx@cache:6379/0"),
    ("redis://:s3cret@cache:6379", "redis://:xxxxx@cache:6379"),
    ("redis://s3cret@cache:6379", "redis://xxxxx@cache:6379"),
    ("amqp://app:p%25ss@rabbit:5672/vh", "amqp://app:xxxxx@rabbit:5672/vh"),
    ("http://am:p@ss@alertmanager:9093", "http://am:xxxxx@alertmanager:9093"),
    ("redis://app:50%off@cache:6379", "redis://<unparseable URL redacted>"),
    ("amqp://app:pa ss@rabbit:5672/", "amqp://<unparseable URL redacted>"),
    ("http://am:s3cret@alertmanager:port", "http://<unparseable URL redacted>"),
    ("redis://app:12/ab@cache:6379", "redis://<unparseable URL redacted>"),
    ("redis://app:12?ab@cache:6379", "redis://<unparseable URL redacted>"),
    ("redis://app:12#ab@cache:6379", "redis://<unparseable URL redacted>"),
    ("app:s3cret@cache:6379", "<unparseable URL redacted>"),
    ("1x://app:50%off@cache", "<unparseable URL redacted>"),
])
def test_redact_url(raw, want):
    assert _redact.url(raw) == want


def test_redact_error():
    raw = "amqp://app:hunter2%Pw0rd@rabbit:5672/"
    try:
        try:
            int("hunter2")
        except ValueError:
            raise ValueError("bad URL %s" % raw)
    except ValueError as e:
        orig, clean = e, _redact.error(e, raw)
    assert isinstance(clean, ValueError) and clean is not orig
    _check("the replaced error", _text(clean))
    assert str(clean).startswith("amqp://<unparseable URL redacted>: not a valid URL: percent-encode")
    plain = ConnectionRefusedError("connect to 127.0.0.1:1 refused")
    assert _redact.error(plain, "amqp://app:hunter2-Pw0rd@127.0.0.1:1/") is plain
    refused = OSError("login amqp://app:hunter2-Pw0rd@rabbit/ refused")
    clean = _redact.error(refused, "amqp://app:hunter2-Pw0rd@rabbit/")
    assert isinstance(clean, ConnectionError) and str(clean) == "login amqp://app:xxxxx@rabbit/ refused"


def test_broker_repr_shows_no_password(rabbit):
    async def look() -> str:
        b = await rabbitmq.connect("amqp://guest:guest@127.0.0.1:%d/" % rabbit.port)
        try:
            return repr(b)
        finally:
            await b.close()
    assert asyncio.run(look()) == "Broker('amqp://guest:xxxxx@127.0.0.1:%d/')" % rabbit.port
