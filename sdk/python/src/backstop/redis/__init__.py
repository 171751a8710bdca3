"""backstop.redis: the Redis queue contract for Python workers.

Jobs live in a Redis stream with a consumer group, cold retries in a delayed
sorted set, dead letters in a stream and counters in a hash; every move
between them is one atomic Lua script (the ones in ``backstop/scripts``,
copies of the contract's ``contract/scripts``) that also acknowledges the
source entry, so a crash at any point loses nothing and an outcome is
applied at most once. ``Queue`` takes a redis-py client (``redis.Redis``,
``redis.RedisCluster``), ``AsyncQueue`` an asyncio one::

    import redis, backstop
    from backstop.redis import Queue

    q = Queue(redis.Redis(), "orders")
    q.ensure_group()
    q.enqueue("order-42", b'{"sku": 7}')
    for job in q.read("worker-1", block_ms=1000):
        try:
            handle(job)
        except Exception as exc:
            q.apply(job, exc, policy)   # retry (delayed), dead letter, as the policy decides
        else:
            q.apply(job, None, policy)  # ack

Needs the ``redis`` extra: ``pip install 'backstop-policy[redis]'``.

The package is a sans-I/O core and two thin I/O layers, as
``backstop.rabbitmq`` is: ``_core.py`` builds every script call and
command, reads every reply and holds every operation's logic (the
worker's loop too) as steps; ``_sync.py`` (``Queue``) does those steps
with redis-py, ``_asyncio.py`` (``AsyncQueue``) with ``redis.asyncio``.
What every broker shares (the job shape, the job-type check, the worker's
steps around a decision) is ``backstop.queue``, as Go's ``queue`` is beside
``queue/redisqueue``. This module used to be ``backstop.queue``: those
imports still work, deprecated. Its log records keep the logger name
``backstop.queue``.
"""

from ._asyncio import AsyncQueue
from ._core import (AsyncHandler, Handler, Job, Keys, Outcome, Payload, Promoted, Ran, Reclaimed, Stats,  # noqa: F401
                    _error_text, _fields_json, _write_refused, log, script_source)
from ._sync import Queue

__all__ = ["AsyncQueue", "Job", "Keys", "Outcome", "Promoted", "Queue", "Ran", "Reclaimed", "Stats"]
