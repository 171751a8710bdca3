"""Deadlines: one attempt of ``Policy.retry`` (the policy's
``attempt_timeout``) or one job of a queue worker (``handler_timeout``),
bounded. A coroutine runs as a task, cancelled at the deadline; a plain
function runs in a thread of its own, abandoned at the deadline (Python
cannot stop a thread): it runs on to its end and its result is dropped.
The function sees the deadline through ``attempt_time_left()``."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from typing import Any, Awaitable, Callable, List, Optional, Tuple

from ._errors import BackstopError

# The monotonic time by which the running attempt (or job) must end; None
# when none applies. A nested deadline never extends the one around it.
_deadline: contextvars.ContextVar[Optional[float]] = contextvars.ContextVar("backstop.deadline", default=None)

# How long a cancelled task is given to end before it is left behind.
_GRACE = 0.5


def attempt_time_left() -> Optional[float]:
    """The seconds left before the deadline of the attempt the enclosing
    ``@policy.retry`` loop is running (its policy's ``attempt_timeout``,
    or what is left of ``max_elapsed``), or of the queue job being
    handled (``handler_timeout``): pass it as the ``timeout=`` of a client
    call, so that a blocking call ends in time. None when no deadline
    applies; 0.0 once it has passed."""
    d = _deadline.get()
    return None if d is None else max(0.0, d - time.monotonic())


class DeadlineExceeded(BackstopError, TimeoutError):
    """An attempt (or a queue job's handler) that did not end by its
    deadline: classified as error kind ``timeout``, decided by the policy
    like any timeout. ``timeout`` is the bound, in seconds; ``abandoned``
    is True when the call still runs (a thread, or a task that ignored
    its cancellation)."""

    def __init__(self, what: str, timeout: float, abandoned: bool) -> None:
        super().__init__("%s deadline exceeded after %s" % (what, _duration(timeout)))
        self.timeout = timeout
        self.abandoned = abandoned


def _duration(seconds: float) -> str:
    ms = round(seconds * 1000)
    return "%dms" % ms if ms < 1000 else "%gs" % (ms / 1000)


def _start(timeout: float) -> Tuple[float, float, contextvars.Context]:
    """The deadline (within any around it), its timeout and a copy of the
    context that carries it."""
    now = time.monotonic()
    outer = _deadline.get()
    deadline = now + timeout
    if outer is not None and outer < deadline:
        deadline, timeout = outer, max(0.0, outer - now)
    ctx = contextvars.copy_context()
    ctx.run(_deadline.set, deadline)
    return deadline, timeout, ctx


def run_within(fn: Callable[[], Any], timeout: float, what: str,
               wait: Optional[Callable[[threading.Event, float], Any]] = None,
               wake: Optional[Callable[[], Any]] = None) -> Any:
    """fn() in a daemon thread of its own, with the caller's context: its
    result, or its exception raised here. DeadlineExceeded after timeout
    seconds, the thread abandoned. ``wait(done, left)`` waits at most left
    seconds (default ``done.wait``: a worker keeps its connection alive
    there); ``wake()`` is called from the thread when fn ends."""
    deadline, timeout, ctx = _start(timeout)
    done = threading.Event()
    out: List[Tuple[bool, Any]] = []

    def run() -> None:
        try:
            out.append((True, ctx.run(fn)))
        except BaseException as e:  # noqa: B902 - raised in the caller
            out.append((False, e))
        done.set()
        if wake is not None:
            try:
                wake()
            except Exception:
                pass  # the caller went on (its connection closed): nothing to wake

    threading.Thread(target=run, name="backstop-" + what, daemon=True).start()
    while not done.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            raise DeadlineExceeded(what, timeout, True)
        if wait is None:
            done.wait(left)
        else:
            wait(done, left)
    ok, v = out[0]
    if ok:
        return v
    raise v


async def await_within(aw: Awaitable[Any], timeout: float, what: str,
                       wait: Optional[Callable[["asyncio.Future[Any]", float], Awaitable[Any]]] = None) -> Any:
    """aw as a task with the caller's context: its result, or its
    exception. At timeout seconds the task is cancelled and given a moment
    (half a second) to end; then DeadlineExceeded, whether it ended or
    not. ``wait(task, left)`` waits at most left seconds (default: for the
    task). Cancelling the caller cancels the task."""
    deadline, timeout, ctx = _start(timeout)
    task = ctx.run(asyncio.ensure_future, aw)
    try:
        while not task.done():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if wait is None:
                await asyncio.wait({task}, timeout=left)
            else:
                await wait(task, left)
    except BaseException:
        task.add_done_callback(_retrieve)
        task.cancel()
        raise
    if task.done():
        return task.result()
    task.add_done_callback(_retrieve)  # its end, whenever it comes, is dropped
    task.cancel()
    await asyncio.wait({task}, timeout=_GRACE)
    raise DeadlineExceeded(what, timeout, not task.done())


def _retrieve(task: "asyncio.Future[Any]") -> None:
    if not task.cancelled():
        task.exception()
