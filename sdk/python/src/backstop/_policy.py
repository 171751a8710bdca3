"""Policy, Decision and load_policy: the policy API over backstop.wasm
(the calls themselves are the host layer's, ``_host``)."""

from __future__ import annotations

import json
import os
import sys
import warnings
import weakref
from typing import Any, Callable, Iterable, List, Mapping, MutableMapping, Optional, Tuple, TypeVar, Union, overload

from ._errors import LintWarning
from ._host import _contract as C
from ._host import abi
from ._host._contract import Decision, Failure, Outcome, Permit  # noqa: F401 (Failure, Permit: backstop's)
from ._host.runtime import Instance, shared
from ._retry import BeforeSleep, Classify, retrying

F = TypeVar("F", bound=Callable[..., Any])

_NO_FAILURE: Any = object()  # decide's failure argument, when only keywords are given
_DEFAULTS, _NFIELDS = C.DEFAULTS, abi._NFIELDS  # every field absent, and how many: decide's merge


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _caller_level() -> int:
    """The stacklevel of warnings.warn, called from a function this one's
    caller calls, that names the first frame outside the package: a
    warning points at the user's load_policy, however deep it was loaded."""
    f, level = sys._getframe(2), 2
    while f is not None and f.f_code.co_filename.startswith(_PACKAGE_DIR):
        f, level = f.f_back, level + 1
    return level


class Policy(C.PolicyFacts, C.PolicyCalls):
    """A retry policy loaded into backstop.wasm. Make one with
    ``load_policy``. It is safe to use from several threads; a stateful
    policy (retry budget, circuit breaker) sees calls one at a time.

    Each Policy has its own budget and breaker state, even when two are
    loaded from the same source. ``close()`` (or a ``with`` block) frees it
    in the module; an unreachable Policy is freed when collected. Its
    methods of one call each (``acquire``, ``record_success``,
    ``budget_tokens``, ``circuit_state``, ``attempt_timeout``) and its
    ``stateful`` and ``on_open`` are generated from the contract
    (``_contract.PolicyCalls``, ``PolicyFacts``).
    """

    def __init__(self, inst: Instance, handle: int) -> None:
        self._inst = inst
        self._h = handle
        # The facts never change: read once. The module answers lint bits;
        # the schema's table (_contract.LINTS) spells them out.
        with inst.lock:
            self._read_facts(lambda export: abi.call(inst, handle, export))
        for lint in self._lints:
            warnings.warn(LintWarning("%s: %s: %s" % (lint.field, lint.code, lint.message), lint.code, lint.field),
                          stacklevel=_caller_level())
        self._finalizer = weakref.finalize(self, abi.finalize, inst, handle)

    @property
    def lints(self) -> Tuple[C.Lint, ...]:
        """The policy's lints (docs/policy.md, "Lints"): ``Lint(code,
        field, message)`` for each choice the retry guidance names as a
        classic mistake, which the policy still decides as written. Each
        was also warned at load, as a ``LintWarning``. Lints its
        ``lint_ignore`` names are left out."""
        return self._lints

    @property
    def connect_timeout(self) -> Optional[float]:
        """The policy's ``connect_timeout`` in seconds, or None when it has
        none (the client's own applies): how long establishing a
        connection may take within an attempt, for the client to enforce,
        e.g. ``httpx.Client(timeout=httpx.Timeout(10, connect=policy.connect_timeout))``
        or requests' ``timeout=(policy.connect_timeout, read)``. A connect
        that runs out (``httpx.ConnectTimeout``) is the error kind
        ``connect_timeout``, not ``timeout``."""
        return self._connect_timeout_ms / 1000 if self._connect_timeout_ms else None

    def decide(self, failure: Mapping[str, Any] = _NO_FAILURE, /, **fields: Any) -> Decision:  # type: ignore[assignment]
        """Decides a failure given as a dict, as keyword fields, or both
        (the keywords win). The field names are those of ``Failure``; a
        ``None`` value is an absent field.

        ``now_ms`` defaults to the host's clock and ``random`` to
        ``random.random()``: the module itself has neither.

        Raises ``InputError`` for an invalid field (the message names it:
        ``attempt: must be >= 1 (got 0)``), for an unknown field name
        (``http_stauts: unknown field``) and for a failure that is not a
        mapping: the first problem in the order of the shared vectors'
        fields, after unknown names, with the message every backstop host
        gives (testdata/vectors/inputs.json).
        """
        try:
            if failure is not _NO_FAILURE:
                fields = {**failure, **fields} if fields else failure  # type: ignore[assignment]
            d = {**_DEFAULTS, **fields}
        except TypeError:  # not a mapping
            d, fields = None, failure
        with self._inst.lock:
            if d is not None and len(d) == _NFIELDS:
                return abi.decide(self._inst, self._h, d, None)
            # Not a mapping, or an unknown field: the core says which.
            return abi.decide_value(self._inst, self._h, fields)

    def decide_many(self, failures: Iterable[Mapping[str, Any]]) -> List[Decision]:
        """Decides many failures, in order, as ``decide`` would one by one,
        but in a few calls into the module (about 1 µs a failure).

        All draws of the host's clock in one call share one ``now_ms``. A
        stateful policy decides the whole batch without interleaving other
        calls. An invalid failure (a field, or an entry that is not a
        mapping) does not stop the batch, as in every backstop host: the
        others are decided (and counted by a stateful policy, in order),
        then ``InputError`` is raised for the first invalid one, with its
        ``index`` and the ``decisions`` (``None`` where invalid).
        """
        fs = failures if isinstance(failures, list) else list(failures)
        now0 = abi.now_ms()
        with self._inst.lock:
            out, first = abi.decide_many(self._inst, self._h, fs, now0)
        if first is not None:
            first.decisions = out
            raise first
        return out  # type: ignore[return-value]

    def outcome(self, event: str, failure: Optional[Mapping[str, Any]] = None, *, deliveries: int = 0,
                max_deliveries: int = 0, now_ms: Optional[int] = None) -> Outcome:
        """What a queue worker does about one event of a job, as the core
        decides it for every language (wasm/ABI.md, "outcome"): ``"before"``
        the job runs (the breaker's gate), ``"success"``, ``"failure"``
        (``failure``: its fields as for ``decide``, with the job's attempt,
        elapsed time, previous delay and id as the idempotency key) or
        ``"delivered"`` (a broker delivered it ``deliveries`` times without
        an outcome; ``max_deliveries`` 0 is no limit). ``now_ms`` is the
        event's time (default: the failure's, else the host's clock).

        Raises InputError for an invalid failure, as ``decide`` does, with
        ``outcome`` the dead letter the core decides for it (``malformed``,
        ``invalid``), and for an invalid event (``now_ms: must be >= 0``);
        ValueError for an unknown event."""
        if event not in C.EVENT_NAMES:
            raise ValueError("outcome: event must be one of %s (got %r)" % (", ".join(C.EVENT_NAMES), event))
        with self._inst.lock:
            return abi.outcome(self._inst, self._h, C.EVENT_NAMES.index(event), {} if failure is None else failure,
                               now_ms, deliveries, max_deliveries)

    def _call(self, export: str, *args: int) -> int:
        """Calls the module's export with this policy's handle and its i64
        arguments (now_ms: abi.at) and returns its result; a negative one
        raises its error (read under the lock, as every call into the
        module)."""
        inst = self._inst
        with inst.lock:
            return abi.call(inst, self._h, export, *args)

    _at = staticmethod(abi.at)
    _ms = staticmethod(abi.ms)

    @overload
    def retry(self, fn: F, /) -> F: ...
    @overload
    def retry(self, fn: None = None, /, *, before_sleep: Optional[BeforeSleep] = None, classify: Optional[Classify] = None,
              method: Optional[str] = None, idempotency_key: Optional[str] = None,
              metrics: Any = None, headers: Optional[MutableMapping[str, str]] = None,
              reraise: bool = False) -> Callable[[F], F]: ...

    def retry(self, fn: Optional[Callable[..., Any]] = None, /, *, before_sleep: Optional[BeforeSleep] = None,
              classify: Optional[Classify] = None, method: Optional[str] = None,
              idempotency_key: Optional[str] = None, metrics: Any = None,
              headers: Optional[MutableMapping[str, str]] = None, reraise: bool = False) -> Any:
        """A decorator that retries a function (sync or ``async def``) as
        this policy decides: ``@policy.retry`` or ``@policy.retry(...)``.

        An exception (``Exception`` subclasses only: ``KeyboardInterrupt``
        and ``asyncio.CancelledError`` propagate at once) is described as a
        failure by ``classify`` (a mapping from exception types, or a
        function), else by ``backstop.describe``; then the policy decides.
        A retry calls ``before_sleep(RetryState)`` (awaited if it returns an
        awaitable) and sleeps ``decision.delay`` (``asyncio.sleep`` for a
        coroutine function, so cancelling the task ends the wait). Giving up
        raises ``RetryError`` from the last exception, with ``reason`` and
        ``attempts``. A success is reported with ``record_success``.
        ``method`` and ``idempotency_key`` describe the request for the
        idempotency gate when the exception does not. On a policy with a
        circuit breaker, each call first asks ``acquire``: a refused call
        raises ``RetryError`` with reason ``circuit_open`` before it is made.
        ``metrics`` (from ``backstop.metrics.create_metrics``) counts
        attempts, retries, refusals, delays and the breaker's state.

        ``reraise=True`` (tenacity's ``reraise``): when the policy gives up
        after a failed attempt, the attempt's own exception is raised
        instead of ``RetryError`` (its traceback is the attempt's), for
        code that catches the client's exceptions. The reason is then only
        in the metrics and ``Backstop-No-Retry``; a breaker's refusal still
        raises ``RetryError("circuit_open")`` (no attempt of the function
        failed), and an outer ``@policy.retry`` no longer sees that this
        loop already retried (retry at one layer: keep the default there).

        Before each attempt the loop asks ``attempt_timeout`` (the
        policy's ``attempt_timeout``, bounded by what is left of
        ``max_elapsed``); with one, the attempt runs within it: a
        coroutine as a task, cancelled at the deadline; a plain function
        in a thread of its own, abandoned at the deadline (it runs on, its
        result dropped: pass ``backstop.attempt_time_left()`` as the
        ``timeout=`` of its client calls so that it ends in time). The
        expiry is ``backstop.DeadlineExceeded``, error kind ``timeout``.

        Retry at one layer (docs/layers.md): a ``RetryError`` of a
        ``@policy.retry`` inside the function (one that made a call: not
        ``circuit_open``), or an HTTP error whose response has
        ``Backstop-No-Retry``, is a failure a layer below already retried:
        the default policy stops at once with ``retried_downstream``
        (``X-Envoy-Overloaded``: ``server_declined``). Each attempt runs with
        its number in ``backstop.current_attempt()``; ``headers`` (a mutable
        mapping, the one the function sends) gets ``backstop-attempt`` and
        ``x-envoy-attempt-count`` before each attempt, except those it had
        before the first, and loses them again when the loop ends. Inside a
        request served by ``OneLayerWSGI`` or ``OneLayerASGI``, the reason a
        loop gave up is sent back in ``Backstop-No-Retry`` on a failed
        response.
        """
        wrap = retrying(self, before_sleep=before_sleep, classify=classify, method=method,
                        idempotency_key=idempotency_key, metrics=metrics, headers=headers, reraise=reraise)
        return wrap(fn) if fn is not None else wrap

    def close(self) -> None:
        """Frees the policy in the module. Later calls raise BackstopError."""
        with self._inst.lock:
            self._h = 0  # under the lock: no call can use the handle once freed
            found = self._finalizer.detach()
            if found is not None:
                abi.free_locked(self._inst, found[2][1])
            abi.drain(self._inst)

    def __enter__(self) -> Policy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# policy.MaxFileBytes (docs/policy.md, "Limits"); a test pins it to the module's.
MAX_POLICY_BYTES = 64 << 10


def load_policy(source: Union[str, bytes, bytearray, Mapping[str, Any], "os.PathLike[str]"]) -> Policy:
    """Loads a policy from a preset name (``"default"``, ``"critical"``,
    ``"batch"``, ``"cloud-tasks"``, ``"fast-transient"``), JSON or YAML text (str or bytes), a
    dict (the policy object) or a ``pathlib.Path`` to a JSON or YAML file.

    Raises ``PolicyError`` naming every invalid field.
    """
    if isinstance(source, os.PathLike):
        with open(source, "rb") as f:
            data = f.read(MAX_POLICY_BYTES + 1)
    elif isinstance(source, str):
        data = source.encode("utf-8")
    elif isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
    elif isinstance(source, Mapping):
        data = json.dumps(source).encode("utf-8")
    else:
        raise TypeError("load_policy: expected a preset name, JSON or YAML text, a dict or a Path (got %s)"
                        % type(source).__name__)
    return load_into(shared(), data)


def load_into(inst: Instance, source: Any) -> Policy:
    """Loads a policy into a given instance (tests use their own)."""
    data = source.encode("utf-8") if isinstance(source, str) else source
    # The module refuses a policy over MAX_POLICY_BYTES with a PolicyError;
    # a byte more than that is all it needs to say so, whatever the size.
    data = data[:MAX_POLICY_BYTES + 1]
    return Policy(inst, abi.load(inst, data))
