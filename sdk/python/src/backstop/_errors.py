"""The exceptions of backstop."""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional, Tuple

if TYPE_CHECKING:  # the host layer imports this module
    from ._host._contract import Decision, Outcome


class BackstopError(Exception):
    """Base class of every error backstop raises."""


class PolicyError(BackstopError, ValueError):
    """A policy (file, text, dict or preset name) that backstop.wasm refused.

    The message is the module's and names every invalid field, for example
    ``invalid policy: backoff.cap: must be >= backoff.base (got 100ms < 1s)``.
    ``problems`` holds the ``(field, reason)`` pairs, ``field`` the first field.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        rest = message[len("invalid policy: "):] if message.startswith("invalid policy: ") else message
        self.problems: List[Tuple[str, str]] = [_split(p) for p in rest.split("; ")]
        self.field: str = self.problems[0][0]


class LintWarning(UserWarning):
    """A policy's lint (docs/policy.md, "Lints"): a choice the retry
    guidance names as a classic mistake, in a policy that still loads and
    decides as written. ``load_policy`` warns once per lint; ``code`` and
    ``field`` say which. Filter it as any warning
    (``warnings.simplefilter("error", LintWarning)`` makes it fail)."""

    def __init__(self, message: str, code: str = "", field: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.field = field


class InputError(BackstopError, ValueError):
    """An invalid failure passed to ``decide``: a field out of range, of the
    wrong type or unknown. The message is the one every backstop host
    reports, ``<field>: <reason>`` (testdata/vectors/inputs.json), such as
    ``attempt: must be >= 1 (got 0)``. ``field`` is the vectors' name, an
    unknown name as given, or ``failure`` when the failure is not a
    mapping. No policy state changed for it.

    From ``decide_many``, ``index`` is the position of the first invalid
    failure (the message starts with ``failures[index]: ``) and ``decisions``
    holds the decisions of the whole batch, ``None`` at invalid positions:
    the valid failures were decided (and counted by a stateful policy).
    From ``Policy.outcome``, ``outcome`` is the core's outcome of an
    invalid failure: a dead letter, reason ``malformed``.
    """

    outcome: Optional[Outcome] = None

    def __init__(self, field: str, reason: str, index: Optional[int] = None,
                 decisions: Optional[List[Optional[Decision]]] = None) -> None:
        prefix = "" if index is None else "failures[%d]: " % index
        super().__init__(prefix + field + ": " + reason)
        self.field = field
        self.reason = reason
        self.index = index
        self.decisions = decisions

    @classmethod
    def _from_module(cls, message: str, index: Optional[int] = None) -> InputError:
        # The module says "invalid failure: <field>: <reason>", prefixed with
        # "record N: " from decide_batch.
        if message.startswith("record "):
            message = message.split(": ", 1)[-1]
        for prefix in ("invalid failure: ", "invalid event: "):
            if message.startswith(prefix):
                message = message[len(prefix):]
        if message.endswith(": unknown field"):  # the name may hold ": " too, or be ""
            return cls(message[:-15], "unknown field", index)
        field, reason = _split(message)
        return cls(field or "failure", reason, index)


class RetryError(BackstopError):
    """Raised by ``Policy.retry`` when the policy says stop.

    It keeps why (``reason``, such as ``max_attempts_reached`` or
    ``permanent_error``), how many attempts ran (``attempts``), the last
    ``decision`` and the last exception (``last_exception``, also
    ``__cause__``: it is raised ``from`` it).
    """

    def __init__(self, reason: str, attempts: int, last_exception: BaseException,
                 decision: Decision) -> None:
        plural = "" if attempts == 1 else "s"
        super().__init__("gave up after %d attempt%s (%s): %r" % (attempts, plural, reason, last_exception))
        self.reason = reason
        self.attempts = attempts
        self.last_exception = last_exception
        self.decision = decision


def _split(problem: str) -> Tuple[str, str]:
    field, sep, reason = problem.partition(": ")
    return (field, reason) if sep else ("", problem)
