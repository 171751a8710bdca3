"""Hiding the credentials of URLs in errors and log records: the rule of
every backstop language (Go: internal/redact).

A URL that parses shows its password as ``xxxxx`` (``amqp://app:xxxxx@host/``;
a user name alone, which some clients take for the password, as
``amqp://xxxxx@host/``); one that does not parse (an unescaped ``%``, a space,
a port that is not a number because a ``/`` ended the host part inside the
password) shows only its scheme: ``amqp://<unparseable URL redacted>``, never
a part of it."""

import re
import traceback
from typing import List, Optional
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit

MASK = "xxxxx"
UNPARSEABLE = "<unparseable URL redacted>"

_HINT = ("not a valid URL: percent-encode the special characters of its user and password "
         "(% as %25, space as %20, @ as %40, : as %3A, / as %2F, ? as %3F, # as %23)")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_USERINFO = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:%@]*")


def url(s: str) -> str:
    """``s`` fit for an error or a log record (see the module's doc)."""
    if not s:
        return s
    parts = _parse(s)
    if parts is None:
        scheme, sep, _ = s.partition("://")
        return scheme + "://" + UNPARSEABLE if sep and _SCHEME.fullmatch(scheme) else UNPARSEABLE
    if "@" not in parts.netloc:
        return s
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, has_password, _ = userinfo.partition(":")
    safe = user + ":" + MASK if has_password else MASK
    return urlunsplit(parts._replace(netloc=safe + "@" + hostport))


def error(exc: BaseException, *urls: str) -> BaseException:
    """``exc`` when every URL of ``urls`` parses and nothing ``exc`` prints
    (message, causes, context) shows one of them or their passwords; else a
    new exception whose message is ``exc``'s with each URL as ``url`` shows
    it and each password as ``MASK``; when a URL does not parse, only that
    URL as ``url`` shows it and a hint to percent-encode (a parser's error
    may quote any fragment of it, which no search for the password finds).
    The new one is a ValueError when
    ``exc`` is one (a URL the library refused), else a ConnectionError when
    ``exc`` is an OSError, else a RuntimeError. Raise it ``from None``, so
    that the original's text is not printed with it."""
    printed = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    secrets = [s for u in urls if u for s in [u, *_secrets(u)]]
    bad = [url(u) for u in urls if u and _parse(u) is None]
    if not bad and not any(s in printed for s in secrets):
        return exc
    msg = str(exc)
    for u in urls:
        if not u:
            continue
        msg = msg.replace(u, url(u))
        for s in _secrets(u):
            msg = msg.replace(s, MASK)
    if bad:  # the parser's own words may quote any fragment: left out
        msg = "%s: %s" % (", ".join(bad), _HINT)
    if isinstance(exc, ValueError):
        return ValueError(msg)
    if isinstance(exc, OSError):
        return ConnectionError(msg)
    return RuntimeError(msg)


def _parse(s: str) -> Optional[SplitResult]:
    """``s`` split, or None when a strict parser (Go's net/url) would refuse
    it, or when an ``@`` lies outside its host part."""
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in s) or _BAD_ESCAPE.search(s):
        return None
    try:
        parts = urlsplit(s)
        parts.port  # raises on a port that is not a number
    except ValueError:
        return None
    userinfo = parts.netloc.rpartition("@")[0]
    if not _USERINFO.fullmatch(userinfo) or ("@" in s and "@" not in parts.netloc):
        return None
    return parts


def _secrets(s: str) -> List[str]:
    """What of ``s`` must never show: its password (or lone user name), as
    written and decoded; for a string that does not parse, everything
    between ``//`` and the last ``@``, and its part after the first ``:``."""
    parts = _parse(s)
    if parts is not None:
        if "@" not in parts.netloc:
            return []
        userinfo = parts.netloc.rpartition("@")[0]
        user, has_password, password = userinfo.partition(":")
        found = [password] if has_password else [user]
    else:
        rest = s.partition("//")[2] or s
        userinfo, at, _ = rest.rpartition("@")
        if not at:
            return []
        found = [userinfo, userinfo.partition(":")[2]]
    out = []
    for v in found:
        for form in (v, unquote(v)):
            if form and form not in out:
                out.append(form)
    return out
