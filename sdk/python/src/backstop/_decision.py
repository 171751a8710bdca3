"""Decision and Permit, the answers of a policy (Policy.decide, Policy.acquire).

A leaf module: it imports nothing of backstop, so that _errors, _policy and
_retry can all use these types without importing one another."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Dict


@dataclass(frozen=True)
class Decision:
    """What to do about a failure.

    ``action`` is ``"retry"`` (after ``delay_ms``) or ``"dead_letter"``;
    ``reason`` says why (``transient``, ``retry_after``, ``uncertain`` for a
    retry; ``permanent_error``, ``max_attempts_reached``, ... otherwise);
    ``klass`` is the failure's class (``retryable``, ``permanent``,
    ``uncertain``; ``"class"`` in JSON). ``delay`` is the delay as a
    ``timedelta`` and ``delay_seconds`` as a float, ready for ``time.sleep``.
    """

    action: str
    delay_ms: int
    reason: str
    klass: str

    @property
    def retry(self) -> bool:
        return self.action == "retry"

    @property
    def delay(self) -> timedelta:
        return timedelta(milliseconds=self.delay_ms)

    @property
    def delay_seconds(self) -> float:
        return self.delay_ms / 1000

    def to_dict(self) -> Dict[str, Any]:
        """The decision in the vector `expect` shape (and key order)."""
        return {"action": self.action, "delay_ms": self.delay_ms, "reason": self.reason, "class": self.klass}


@dataclass(frozen=True)
class Permit:
    """The answer of ``Policy.acquire``: whether a call may be made now.

    ``allowed`` is False while the breaker is open, or half-open with every
    trial call out; ``retry_in_ms`` then says when to ask again (the breaker
    half-opens, or the trials time out), 0 when allowed. ``state`` is the
    breaker's state when asked: ``"closed"`` (also without a breaker),
    ``"open"`` or ``"half_open"``.
    """

    allowed: bool
    retry_in_ms: int
    state: str

    @property
    def retry_in(self) -> timedelta:
        return timedelta(milliseconds=self.retry_in_ms)

    def to_dict(self) -> Dict[str, Any]:
        """The permit in the vector `permit` shape."""
        return {"allowed": self.allowed, "retry_in_ms": self.retry_in_ms, "state": self.state}
