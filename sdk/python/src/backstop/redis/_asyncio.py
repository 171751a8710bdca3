"""``backstop.redis.AsyncQueue``: the Redis queue over ``redis.asyncio``.
The I/O layer only: each coroutine runs an operation of the core
(``_core.py``) by doing its steps with the client, the worker's handler as
a task."""

from __future__ import annotations

import asyncio
import inspect
from datetime import datetime, timedelta
from typing import Any, Awaitable, Callable, List, Mapping, Optional, Sequence, Union

import redis

from .. import _decide
from .. import queue as _queue
from .._deadline import await_within
from .._policy import Policy
from .._retry import Classify
from ._core import (AsyncHandler, Handle, Job, Keys, Outcome, Pause, Payload, Promoted, Ran, Reclaimed, Stats, Step,
                    Steps, T, _Base, advance)
from ._core import Tell, log


async def drive(steps: Steps[T], do: Callable[[Step], Awaitable[Any]]) -> T:
    """Runs an operation of the core: ``await do(step)`` does each step's I/O."""
    done, v = advance(steps)
    while not done:
        try:
            reply = await do(v)
        except Exception as e:
            done, v = advance(steps, error=e)
        else:
            done, v = advance(steps, reply)
    return v  # type: ignore[no-any-return]


class AsyncQueue(_Base):
    """``Queue`` for asyncio, over ``redis.asyncio.Redis`` or
    ``redis.asyncio.RedisCluster``: the same methods, as coroutines."""

    def __init__(self, client: Any, name: str, *, keys: Optional[Keys] = None, group: str = "workers") -> None:
        if not inspect.iscoroutinefunction(getattr(client, "execute_command", None)):
            raise TypeError("AsyncQueue needs a redis.asyncio client; use Queue with a synchronous one")
        super().__init__(client, name, keys=keys, group=group)

    async def _do(self, step: Step) -> Any:
        return await self._call(step)  # type: ignore[arg-type]

    async def _drive(self, steps: Steps[T]) -> T:
        return await drive(steps, self._do)

    async def ensure_group(self) -> bool:
        """See ``Queue.ensure_group``."""
        return await self._drive(self._ensure_group_steps())

    async def enqueue(self, job_id: str, payload: Payload = b"", job_type: Optional[str] = None) -> str:
        """See ``Queue.enqueue``."""
        return await self._drive(self._enqueue_steps(job_id, payload, job_type))

    async def ack(self, entry: Union[str, Job]) -> bool:
        """See ``Queue.ack``."""
        return await self._drive(self._ack_steps(entry))

    async def retry(self, entry: Union[str, Job], delay_ms: Union[int, timedelta], reason: str,
                    last_error: str = "") -> Optional[int]:
        """See ``Queue.retry``."""
        return await self._drive(self._later_steps("retry", entry, delay_ms, reason, last_error))

    async def defer(self, entry: Union[str, Job], delay_ms: Union[int, timedelta], reason: str,
                    last_error: str = "") -> Optional[int]:
        """See ``Queue.defer``."""
        return await self._drive(self._later_steps("defer", entry, delay_ms, reason, last_error))

    async def dead_letter(self, entry: Union[str, Job], reason: str, last_error: str = "") -> Optional[str]:
        """See ``Queue.dead_letter``."""
        return await self._drive(self._dead_letter_steps(entry, reason, last_error))

    async def promote(self, limit: int = 500) -> Promoted:
        """See ``Queue.promote``."""
        return await self._drive(self._promote_steps(limit))

    async def run(self, job_id: Optional[str] = None, *, due_before: Union[None, int, datetime] = None,
                  limit: int = 100, actor: Optional[str] = None) -> Ran:
        """See ``Queue.run``."""
        return await self._drive(self._run_steps(job_id, due_before, limit, actor))

    async def reclaim(self, consumer: str, *, min_idle_ms: Union[int, timedelta] = 60_000, count: int = 100,
                      max_deliveries: int = 5) -> Reclaimed:
        """See ``Queue.reclaim``."""
        return await self._drive(self._reclaim_steps(consumer, min_idle_ms, count, max_deliveries))

    async def replay(self, limit: int = 1000, reason: Optional[str] = None, *, job_type: Optional[str] = None,
                     actor: Optional[str] = None) -> int:
        """See ``Queue.replay``."""
        return await self._drive(self._replay_steps(limit, reason, job_type, actor))

    async def hold(self, consumer: str, entries: Sequence[Union[str, Job]]) -> List[bool]:
        """See ``Queue.hold``."""
        return await self._drive(self._hold_steps(consumer, entries))

    async def read(self, consumer: str, *, count: int = 16,
                   block_ms: Optional[Union[int, timedelta]] = None) -> List[Job]:
        """See ``Queue.read``."""
        return await self._drive(self._read_steps(consumer, count, block_ms))

    async def stats(self) -> Stats:
        """See ``Queue.stats``."""
        return await self._drive(self._stats_steps())

    async def apply(self, job: Job, exc: Optional[BaseException], policy: Policy, *,
                    classify: Optional[Classify] = None) -> Outcome:
        """See ``Queue.apply``."""
        return await self._drive(self._apply_steps(job, exc, policy, classify))

    async def _move(self, job: Job, plan: _decide.Plan) -> Outcome:
        """See ``Queue._move``."""
        return await self._drive(self._move_steps(job, plan))

    async def work(self, policy: Policy, handler: AsyncHandler, *, consumer: Optional[str] = None,
                   stop: Optional[asyncio.Event] = None, classify: Optional[Classify] = None, batch: int = 16,
                   block_ms: int = 1000, promote_every: float = 1.0, promote_limit: int = 500,
                   reclaim_every: float = 30.0, min_idle_ms: int = 60_000, max_deliveries: int = 5,
                   metrics: Any = None, policies: Optional[Mapping[str, Policy]] = None,
                   handler_timeout: Union[None, float, timedelta] = None, on_outcome: Any = None) -> None:
        """``Queue.work`` for asyncio: ``handler`` is a coroutine function
        (or returns an awaitable), run one job at a time; ``stop`` an
        ``asyncio.Event``. Cancelling the task ends it at once: a job whose
        handler was cancelled gets no outcome and stays pending for
        ``reclaim``; set ``stop`` to finish the batch first. Outcomes Redis
        refuses are kept and sent again, crash loops reclaim could not
        dead-letter are logged, and a job the breaker refuses is deferred
        while the worker stops reading, as ``Queue.work`` does. The
        awaitable a handler returns runs as a task within
        ``handler_timeout`` (as ``Queue.work``'s, with the same holds), and
        is cancelled at the deadline; the worker gives it half a second to
        end, then moves on (logged). ``on_outcome`` as ``Queue.work``'s;
        an awaitable it returns is awaited."""
        stop = stop or asyncio.Event()

        async def do(step: Step) -> Any:
            if isinstance(step, Pause):
                try:
                    await asyncio.wait_for(stop.wait(), step.seconds)
                except asyncio.TimeoutError:
                    pass
            elif isinstance(step, Handle):
                ids = step.ids

                async def hold(task: "asyncio.Future[Any]", left: float) -> None:
                    await asyncio.wait({task}, timeout=min(left, step.beat))
                    if not task.done():
                        try:
                            await self.hold(step.consumer, ids)
                        except (redis.RedisError, ValueError):
                            pass

                r = handler(step.job)
                if inspect.isawaitable(r):
                    await await_within(r, step.timeout, "handler", hold)
            elif isinstance(step, Tell):
                await _queue.atell(step.on_outcome, step.event, log)
            else:
                return await self._call(step)
            return None

        await drive(self._work_steps(policy, stop, consumer, classify, batch, block_ms, promote_every, promote_limit,
                                     reclaim_every, min_idle_ms, max_deliveries, metrics, policies, handler_timeout,
                                     on_outcome), do)
