"""backstop.rabbitmq: the queue contract on RabbitMQ for asyncio workers,
over aio-pika (the topology, headers and moves of queue/rabbitmq/README.md,
the same as the Go and Node.js workers')::

    from backstop import rabbitmq

    broker = await rabbitmq.connect("amqp://guest:guest@127.0.0.1:5672/")
    q = broker.queue("emails")
    await q.enqueue("job-1", b'{"to": "a@example.com"}', job_type="send_email")
    await q.work(policy, handle, prefetch=16)   # until cancelled; in-flight jobs finish first

Every outcome is published with publisher confirms before the delivery is
acked: a crash in between duplicates a job, never loses it. Retries wait in
the delay levels (no head-of-line blocking), dead letters go to ``Q.dlq``,
and ``replay`` sends them back to ``Q`` only. ``backstop.rabbitmq.sync`` is
the same over pika, for threads.

Needs the ``rabbitmq`` extra: ``pip install 'backstop-policy[rabbitmq]'``.
"""

from __future__ import annotations

import asyncio
import inspect as _inspect
import logging
import time
from datetime import datetime, timedelta
from typing import Any, Awaitable, Callable, Dict, List, Mapping, Optional, Set, Union

try:
    import aio_pika
    import aiormq.exceptions
    from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("backstop.rabbitmq needs aio-pika: pip install 'backstop-policy[rabbitmq]'") from e

from .. import queue as _queue
from .. import _decide, _redact
from .._deadline import await_within
from .._policy import Policy
from .._retry import Classify
from . import _core, _work
from ._core import DeadLetter, Job, Stats
from ._metrics import QueueMetrics

__all__ = ["Broker", "DeadLetter", "Job", "Queue", "Ran", "SilentMovers", "Stats", "connect"]

Ran = _core.Ran
SilentMovers = _core.SilentMovers

log = logging.getLogger("backstop.rabbitmq")

Handler = Callable[[Job], Union[Awaitable[Any], Any]]

# What the broker answers a declaration it refuses: not worth connecting again.
_REFUSED = (aiormq.exceptions.ChannelPreconditionFailed, aiormq.exceptions.ChannelNotFoundEntity,
            aiormq.exceptions.ChannelAccessRefused)


async def connect(url: str, *, timeout: float = 10.0) -> "Broker":
    """Connects to the broker at ``url`` (``amqp://user:pass@host:port/vhost``).
    The connection is opened again when it is lost: by ``work`` (with
    backoff) and by the next call of any other method."""
    if not isinstance(url, str) or not url:
        raise ValueError("connect: url must be a non-empty amqp:// URL (got %r)" % (url,))
    b = Broker(url, timeout)
    await b._connection()
    return b


class Broker:
    """A connection to one RabbitMQ virtual host. Make it with ``connect``."""

    def __init__(self, url: str, timeout: float) -> None:
        self.url = url
        self._timeout = timeout
        self._conn: Optional[AbstractConnection] = None
        self._lock = asyncio.Lock()
        self._shared_declared = False
        self._closed = False
        self._mover: Optional[_Mover] = None
        self._movers = 0  # workers running: the mover runs while there is one

    def __repr__(self) -> str:
        return "Broker(%r)" % (_redact.url(self.url),)

    def queue(self, name: str, *, max_deliveries: int = 5) -> "Queue":
        """Work queue ``name``: a delivery whose ``x-delivery-count`` reaches
        ``max_deliveries`` (its consumers kept dying) is dead-lettered as
        ``crash_loop`` without running; the broker's own
        ``x-delivery-limit`` is ``max_deliveries + 2``."""
        return Queue(self, _core.check_name("queue", "name", name),
                     _core.check_int("queue", "max_deliveries", max_deliveries, 1, 1000))

    async def close(self) -> None:
        """Closes the connection; workers on it stop as if cancelled."""
        self._closed = True
        if self._conn is not None and not self._conn.is_closed:
            await self._conn.close()

    async def __aenter__(self) -> "Broker":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def _connection(self) -> AbstractConnection:
        async with self._lock:
            if self._closed:
                raise RuntimeError("rabbitmq: the broker connection is closed")
            if self._conn is None or not _alive(self._conn):
                if self._conn is not None:
                    try:
                        await self._conn.close()
                    except Exception:
                        pass
                try:
                    self._conn = await aio_pika.connect(self.url, timeout=self._timeout)
                except Exception as e:
                    clean = _redact.error(e, self.url)  # yarl's errors quote parts of a bad URL
                    if clean is e:
                        raise
                    raise clean from None
                _log_blocked(self._conn)
                self._shared_declared = False
            return self._conn

    async def _channel(self, prefetch: int = 0) -> AbstractChannel:
        ch = await (await self._connection()).channel(publisher_confirms=True, on_return_raises=True)
        if prefetch:
            await ch.set_qos(prefetch_count=prefetch)
        return ch

    async def _declare(self, ch: AbstractChannel, topo: _core.Topology) -> None:
        exchanges = {}
        for name, kind in topo.exchanges:
            exchanges[name] = await ch.declare_exchange(name, kind, durable=True)
        for name, args in topo.queues:
            await ch.declare_queue(name, durable=True, arguments=args)
        for queue, exchange, key, args in topo.queue_bindings:
            q = await ch.get_queue(queue, ensure=False)
            await q.bind(exchange, key, arguments=args or None)
        for dest, source, key, args in topo.exchange_bindings:
            x = exchanges.get(dest) or await ch.get_exchange(dest, ensure=False)
            await x.bind(source, key, arguments=args or None)
        for queue, exchange, key in topo.queue_unbindings:
            await (await ch.get_queue(queue, ensure=False)).unbind(exchange, key)

    async def _declare_shared(self, ch: AbstractChannel) -> None:
        """The delay levels, once per connection."""
        if not self._shared_declared:
            await self._declare(ch, _core.SHARED)
            self._shared_declared = True

    def _start_mover(self) -> None:
        self._movers += 1
        if self._mover is None:
            self._mover = _Mover(self)

    async def _stop_mover(self) -> None:
        self._movers -= 1
        m = self._mover
        if self._movers == 0 and m is not None:
            self._mover = None
            await m.stop()


class Queue:
    """One work queue ``Q`` with its DLQ and delays (``Broker.queue``)."""

    def __init__(self, broker: Broker, name: str, max_deliveries: int) -> None:
        self.broker = broker
        self.name = name
        self.max_deliveries = max_deliveries
        self._declared_on: Optional[AbstractConnection] = None

    def __repr__(self) -> str:
        return "Queue(%r, max_deliveries=%d)" % (self.name, self.max_deliveries)

    async def _op(self, fn: Callable[[AbstractChannel], Awaitable[Any]]) -> Any:
        """fn on a channel of its own; once more on a new connection when
        the connection went meanwhile (a broker restart)."""
        for again in (True, False):
            conn = await self.broker._connection()
            ch = await conn.channel(publisher_confirms=True, on_return_raises=True)
            try:
                return await fn(ch)
            except Exception:
                if again and not _alive(conn):
                    continue
                raise
            finally:
                if not ch.is_closed:
                    try:
                        await ch.close()
                    except Exception:
                        pass

    async def declare(self) -> None:
        """Declares the topology (idempotent; ``enqueue`` and ``work`` call
        it once per connection)."""
        await self._op(self._declare_on)

    async def _declare_on(self, ch: AbstractChannel) -> None:
        b = self.broker
        conn = await b._connection()
        await b._declare_shared(ch)
        await b._declare(ch, _core.topology(self.name, self.max_deliveries))
        self._declared_on = conn

    async def _ensure(self, ch: AbstractChannel) -> None:
        if self._declared_on is not await self.broker._connection():
            await self._declare_on(ch)

    async def enqueue(self, job_id: str, payload: _core.Payload = b"", job_type: Optional[str] = None, *,
                      content_type: Optional[str] = None, delay: Union[None, float, timedelta] = None) -> None:
        """Publishes job ``job_id`` (its stable identity, the idempotency
        key) as attempt 1, first enqueued now, and returns once the broker
        confirmed it; with ``delay`` (seconds or a timedelta, at most 30
        days) it runs no earlier than that from now."""
        _core.check_name("enqueue", "job_id", job_id)
        body = _core.payload_bytes(payload)
        if job_type is not None:
            _queue.check_job_type("enqueue", "job_type", job_type)
        wait = _core.delay_ms("enqueue", delay)

        async def run(ch: AbstractChannel) -> None:
            await self._ensure(ch)
            pub = _core.enqueued(self.name, job_id, job_type, wait, _core.now_ms())
            await _publish(ch, pub, {"content_type": content_type}, body)

        await self._op(run)

    async def work(self, policy: Policy, handler: Handler, *, prefetch: int = 16, registry: Any = None,
                   metrics_policy: str = "default", classify: Optional[Classify] = None,
                   policies: Optional[Mapping[str, Policy]] = None,
                   handler_timeout: Union[None, float, timedelta] = None, on_outcome: Any = None) -> None:
        """Consumes the queue until the task is cancelled: runs
        ``handler(job)`` (a coroutine function, or a plain one), up to
        ``prefetch`` at a time, and applies its outcome as ``policy``
        decides (classified by ``classify``, as ``Policy.retry`` does).

        Cancelling stops new deliveries, lets the jobs in flight finish and
        apply their outcomes, then raises ``CancelledError``. A lost
        connection (a broker restart) is opened again with backoff (0.1 s
        doubling to 5 s); an outcome known but not applied when it was lost
        is applied when the message comes back, without running the job
        again. A topology the broker refuses (the queue exists with other
        arguments: another ``max_deliveries``) raises at once. With
        ``registry`` (prometheus_client), the worker counts
        ``backstop_client_*`` (policy label ``metrics_policy``) and the
        queue families of the README. ``policies`` maps a job type to its
        own policy (as ``backstop.redis.Queue.work``'s): a job of that type
        is gated, decided and counted (policy label = the type) by it.

        While it runs, the broker also runs a mover (one per connection, on
        a channel of its own): it moves the delayed messages of every queue
        of the virtual host down the delay levels (README, "The moves
        between levels are the workers'").

        The awaitable a handler returns runs as a task within
        ``handler_timeout`` seconds (default 5 minutes: keep it below the
        broker's ``consumer_timeout``, 30 minutes by default, past which
        the broker closes the channel and delivers the job again). At the
        deadline the task is cancelled, given half a second to end, and
        the job fails with ``backstop.DeadlineExceeded`` (error kind
        ``timeout``), decided and applied like any failure; cancelling
        the worker meanwhile still waits for that outcome.

        ``on_outcome`` (a callable, or None) is called with a
        ``backstop.queue.OutcomeEvent`` for each outcome the worker applied
        (its next message confirmed and the delivery acked): successes,
        retries, deferrals, dead letters (crash loops and malformed
        messages too), as Node's ``onOutcome`` and Go's
        ``WithOutcomeHook``, for per-job alerting (docs/monitoring.md,
        "Page on a dead letter of a job type"). What it raises is logged,
        and the worker goes on. An awaitable it returns is awaited."""
        runner, timeout, qm, kept, backoff = _work.setup(log, self.name, policy, handler, prefetch, classify, registry,
                                                         metrics_policy, policies, handler_timeout, on_outcome)
        self.broker._start_mover()
        try:
            while True:
                try:
                    await self._consume(runner, handler, prefetch, timeout, qm, kept, backoff)
                except (asyncio.CancelledError, *_REFUSED):
                    raise  # a topology the broker refuses (other arguments, no permission) stays refused
                except Exception as e:
                    if self.broker._closed:
                        return
                    pause = backoff.next()
                    log.warning("queue %s: connection lost, connecting again in %.1fs: %s", self.name, pause, e)
                    await asyncio.sleep(pause)
        finally:
            await asyncio.shield(self.broker._stop_mover())

    async def _consume(self, runner: _decide.Runner, handler: Handler, prefetch: int, timeout: float,
                       qm: Optional[QueueMetrics], kept: _core.Kept, backoff: _core.Backoff) -> None:
        ch = await self.broker._channel(prefetch)
        lost = asyncio.Event()
        ch.close_callbacks.add(lambda *_: lost.set())
        stopping = asyncio.Event()  # cancelled: confirms are awaited APPLY_GRACE_S more at most
        alone = _ByMessageId()
        inflight: Set["asyncio.Task[Any]"] = set()
        name = self.name

        async def apply(msg: AbstractIncomingMessage, job: Job, plan: Optional[_decide.Plan],
                        pub: Optional[_core.Publish], published: bool, refusals: int = 0) -> bool:
            """Publishes (confirmed), then acks; whether both happened. An
            outcome the broker refused (its ``refusals``-th time before) is
            kept and the delivery handed back after a pause; one the lost
            channel stopped halfway is kept."""
            try:
                if pub is not None and not published:
                    mid = pub.message_id or msg.message_id or ""
                    await _until_stopped(alone.run(mid, lambda: _publish(ch, pub, msg)), stopping)
                    published = True
                await msg.ack()
                return True
            except aiormq.exceptions.DeliveryError as e:
                n = refusals + 1
                if plan is not None:
                    kept.keep(job, plan, published, n)
                pause = _core.refused_pause(n)
                log.warning("queue %s: outcome of job %s (attempt %d) refused by the broker, kept; handed back in "
                            "%.2fs: %s", name, job.id, job.attempt, pause, e)
                await asyncio.sleep(pause)
                try:
                    await msg.nack(requeue=True)
                except Exception:
                    pass  # the channel went meanwhile: the delivery went back with it
                return False
            except Exception as e:
                if plan is not None:
                    kept.keep(job, plan, published)
                log.warning("queue %s: outcome of job %s (attempt %d) not applied, kept for its redelivery: %s",
                            name, job.id, job.attempt, e)
                return False

        async def on_message(msg: AbstractIncomingMessage) -> None:
            # A task of the worker's own: aiormq cancels the tasks it runs
            # consumers in when the channel closes, and a job in flight must
            # finish so that its outcome is kept for the message's return.
            t = asyncio.ensure_future(deliver(msg))
            inflight.add(t)
            t.add_done_callback(inflight.discard)

        async def deliver(msg: AbstractIncomingMessage) -> None:
            try:
                job = _core.job_from(name, msg.message_id, msg.headers, msg.body, msg.content_type, msg.timestamp,
                                     redelivered=bool(msg.redelivered))
                policy, client = runner.policy_for(job)
                step = _core.triage(job, policy, self.max_deliveries, kept, _core.now_ms())
                first = _core.before_run(name, job, step, _core.now_ms())
                if first is not None:
                    await apply(msg, job, None, first, False)
                    return
                plan = step.plan
                if plan is None:
                    runner.measure(client, job, _core.now_ms())
                    exc: Optional[Exception] = None
                    started = time.monotonic()
                    try:
                        r = handler(job)
                        if _inspect.isawaitable(r):
                            await await_within(r, timeout, "handler")
                    except Exception as e:
                        exc = runner.failure(job, e)
                    plan = runner.plan(job, exc, policy, _core.now_ms(), took=time.monotonic() - started)
                    runner.count(client, policy, job, plan)
                elif step.gated:
                    runner.count(client, policy, job, plan)
                pub = _core.move(name, job, plan, _core.now_ms())
                if await apply(msg, job, plan, pub, step.published, step.refusals):
                    if qm is not None:
                        qm.observe(job, plan)
                    if runner.on_outcome is not None:
                        await _queue.atell(runner.on_outcome, runner.event(job, plan), log)
            except Exception:
                # Returned now rather than held until the channel closes; a
                # delivery that keeps failing here ends as a crash loop.
                log.exception("queue %s: delivery not handled; the broker delivers it again", name)
                try:
                    await msg.nack(requeue=True)
                except Exception:
                    pass

        try:
            await self._ensure(ch)
            q = await ch.get_queue(name, ensure=False)
            tag = await q.consume(on_message)
            backoff.reset()
            try:
                await lost.wait()
            except asyncio.CancelledError:
                # Graceful: no new deliveries; the ones in flight finish,
                # their confirms awaited APPLY_GRACE_S more at most (then
                # the channel closes: their outcomes are unknown, kept).
                stopping.set()
                await _within_grace(q.cancel(tag))
                while inflight:
                    await asyncio.shield(asyncio.wait(set(inflight)))
                raise
            raise ConnectionError("channel closed")
        finally:
            if not ch.is_closed:
                await _within_grace(ch.close())

    async def replay(self, limit: int = 1000, reason: Optional[str] = None, keep_attempts: bool = False, *,
                     scan: Optional[int] = None, actor: Optional[str] = None) -> int:
        """Moves at most ``limit`` dead letters (with ``reason`` only, when
        given) back to the work queue, to its name on the default exchange
        only, among the first ``scan`` (default 10 × limit). A replayed job
        starts afresh (attempt 1, first enqueued now) unless
        ``keep_attempts``; the dead letter's reason becomes its last
        reason. Dead letters without a job id, or that do not match, stay.
        Returns how many moved. With ``actor`` (who, 1..256 bytes), each
        one is first recorded in the audit queue ``Q.audit`` (its headers,
        ``backstop-audit-action`` replay, ``-actor``, ``-at-ms``; no body),
        as the Go CLI's ``dlq replay`` records its own."""
        limit, reason, scan = _core.replay_args(limit, reason, scan)
        actor = _core.check_actor("replay", actor)
        ch = await self.broker._channel()
        held: List[AbstractIncomingMessage] = []
        moved = 0
        try:
            await self._ensure(ch)
            if actor:
                await ch.declare_queue(self.name + ".audit", durable=True, arguments=_core.AUDIT_ARGUMENTS)
            dlq = await ch.get_queue(self.name + ".dlq", ensure=False)
            for _ in range(scan):
                if moved >= limit:
                    break
                msg = await dlq.get(no_ack=False, fail=False)
                if msg is None:
                    break
                d = _core.dead_letter_from(msg.message_id, msg.headers, msg.body)
                if not _core.matches(d, reason):
                    held.append(msg)
                    continue
                if actor:  # the record first: never a replay unrecorded
                    props = {k: getattr(msg, k) for k in _core.PROPERTIES}
                    await _publish(ch, _core.replay_record(self.name, d, actor, _core.now_ms()), props, b"")
                await _publish(ch, _core.replayed(self.name, d, keep_attempts, _core.now_ms()), msg)
                await msg.ack()
                moved += 1
            await _give_back(ch, self.name + ".dlq", held)
        finally:
            await ch.close()
        return moved

    async def run(self, job_id: Optional[str] = None, *, due_before: Union[None, int, datetime] = None,
                  limit: Optional[int] = None) -> _core.Ran:
        """Moves delayed jobs of the queue to it now, whatever their due time
        (Cloud Tasks' RunTask; Go's ``Queue.Run``, ``backstop queue run
        --amqp.url``; README, "Run a delayed job now"): the job ``job_id``
        (every copy of it), or at most ``limit`` (1..10000, default 100) of
        those due at or before ``due_before`` (an aware datetime or unix ms).
        Takes them from the delay levels' ready messages (at most 100,000
        looked at) and from the workers' movers (the ``backstop.run``
        exchange), each published to the queue with its attempt kept and
        without its due time (confirmed), then acked. Returns ``(moved,
        left)``; raises ``SilentMovers`` (with ``ran``) when a mover did not
        answer within 5 s."""
        cmd = _core.run_args(self.name, job_id, due_before, limit)
        ch = await self.broker._channel()
        moved = left = 0
        try:
            await self._ensure(ch)
            scan = 100_000
            for name in _core.RUN_LEVELS:
                level = await ch.get_queue(name, ensure=False)
                held: List[AbstractIncomingMessage] = []
                try:
                    while scan > 0:
                        msg = await level.get(no_ack=False, fail=False)
                        if msg is None:
                            break
                        scan -= 1
                        if not _core.run_selects(cmd, msg.message_id, msg.headers):
                            held.append(msg)
                        elif moved >= cmd.limit:
                            left += 1
                            held.append(msg)
                        else:
                            await _publish(ch, _core.run_publish(msg.headers), msg)
                            await msg.ack()
                            moved += 1
                finally:
                    await _give_back(ch, name, held)
            hold0 = await ch.declare_queue(_core.hold(0), passive=True)
            movers = hold0.declaration_result.consumer_count or 0
            if movers == 0:
                return _core.Ran(moved, left)
            replies: List[AbstractIncomingMessage] = []
            arrived = asyncio.Event()

            async def on_reply(msg: AbstractIncomingMessage) -> None:
                replies.append(msg)
                arrived.set()

            reply_to = await ch.get_queue("amq.rabbitmq.reply-to", ensure=False)
            await reply_to.consume(on_reply, no_ack=True)

            async def ask(exchange: str, key: str, op: str, n: int, want: int) -> None:
                replies.clear()
                x = ch.default_exchange if exchange == "" else await ch.get_exchange(exchange, ensure=False)
                await x.publish(aio_pika.Message(b"", headers=_core.run_ask(cmd, op, n), reply_to="amq.rabbitmq.reply-to"), key)
                deadline = time.monotonic() + _core.RUN_WAIT_S
                while len(replies) < want and time.monotonic() < deadline:
                    arrived.clear()
                    try:
                        await asyncio.wait_for(arrived.wait(), max(0.0, deadline - time.monotonic()))
                    except asyncio.TimeoutError:
                        break

            await ask(_core.RUN, "", "count", 0, movers)
            takes = _core.run_movers([m.headers for m in replies], movers, cmd.limit, _core.Ran(moved, left))
            try:
                take = next(takes)
                while True:
                    await ask("", take[0], "take", take[1], 1)
                    take = takes.send(replies[0].headers if replies else None)
            except StopIteration as done:
                return done.value
        finally:
            await ch.close()

    async def inspect(self, n: int = 20) -> List[DeadLetter]:
        """A peek at the first ``n`` dead letters: each is given back to the
        DLQ, in order, without being used up by the looks (``_core.refresh``;
        README, "The DLQ workflow"); ``headers`` leave out
        ``x-delivery-count``."""
        _core.check_int("inspect", "n", n, 1, 10000)

        async def run(ch: AbstractChannel) -> List[DeadLetter]:
            await self._ensure(ch)
            dlq = await ch.get_queue(self.name + ".dlq", ensure=False)
            out, held = [], []
            for _ in range(n):
                msg = await dlq.get(no_ack=False, fail=False)
                if msg is None:
                    break
                held.append(msg)
                out.append(_core.dead_letter_from(msg.message_id, msg.headers, msg.body))
            await _give_back(ch, self.name + ".dlq", held)
            return out

        return list(await self._op(run))

    async def stats(self) -> Stats:
        """Ready jobs and consumers of the work queue, the DLQ's depth, and
        the messages ready in the delay levels (``hold.L0..L10`` and the
        first topology's ``L0..L17``; those a running mover holds are
        unacked, not counted). Passive declarations: a missing queue
        raises."""

        async def run(ch: AbstractChannel) -> Stats:
            q = await ch.declare_queue(self.name, passive=True)
            d = await ch.declare_queue(self.name + ".dlq", passive=True)
            r, dr = q.declaration_result, d.declaration_result
            levels = 0
            for name in [_core.hold(n) for n in range(_core.HOLD_LEVELS)] + [_core.level(n) for n in range(_core.LEVELS)]:
                try:
                    levels += (await ch.declare_queue(name, passive=True)).declaration_result.message_count or 0
                except aio_pika.exceptions.ChannelClosed:
                    await ch.reopen()  # a missing level closed it
            return Stats(r.message_count or 0, r.consumer_count or 0, dr.message_count or 0, levels)

        return await self._op(run)  # type: ignore[no-any-return]


class _Mover:
    """The broker's mover (README, "The moves between levels are the
    workers'"): on a channel of its own in confirm mode it consumes
    ``hold.L0..L10`` and holds each delivery until ``_core.release_ms``,
    then publishes it unchanged to its next exchange, waits for the
    confirm and acks it; a move the broker returns is dead-lettered
    (``unroutable``), one it refuses enters the delay again for 10 s
    (``_core.after_move``), and only what is refused after that is held
    and tried again after 10 s. A lost channel returns the held
    deliveries to the broker by itself; the mover consumes again with
    backoff.

    Its moves run side by side on one channel, but one at a time per
    message id (``_ByMessageId``)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.channel: Optional[AbstractChannel] = None
        self.held: Dict["asyncio.Task[Any]", AbstractIncomingMessage] = {}  # a task per delivery held
        self.waiting: Dict["asyncio.Task[Any]", int] = {}  # those still waiting for their time: their level
        self.alone = _ByMessageId()
        self.task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        """Stops it: its channel closes, and what it held goes back to the levels."""
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)

    async def _run(self) -> None:
        backoff = _core.Backoff()
        while True:
            try:
                await self._session(backoff)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if self.broker._closed:
                    return
                pause = backoff.next()
                log.warning("delay mover: channel lost, consuming again in %.1fs: %s", pause, e)
                await asyncio.sleep(pause)

    async def _session(self, backoff: _core.Backoff) -> None:
        b = self.broker
        ch = await b._channel(_core.MOVE_PREFETCH)
        self.channel = ch
        lost = asyncio.Event()
        ch.close_callbacks.add(lambda *_: lost.set())

        def on_message(n: int) -> Callable[[AbstractIncomingMessage], Awaitable[None]]:
            async def take(msg: AbstractIncomingMessage) -> None:
                t = asyncio.ensure_future(self._hold(ch, n, msg, _core.now_ms()))
                self.held[t] = msg
                t.add_done_callback(lambda t: self.held.pop(t, None))
            return take

        try:
            await b._declare_shared(ch)  # the hold queues
            for n in range(_core.HOLD_LEVELS):
                await (await ch.get_queue(_core.hold(n), ensure=False)).consume(on_message(n))
            # Run's commands (README, "Run a delayed job now"): a queue of
            # this channel's own on the run exchange.
            commands = await ch.declare_queue("", exclusive=True, auto_delete=True)
            await commands.bind(_core.RUN)

            async def on_command(cmd: AbstractIncomingMessage) -> None:
                try:
                    await self._answer_run(ch, cmd, commands.name)
                except Exception as e:
                    log.warning("delay mover: run command: %s", e)

            await commands.consume(on_command, no_ack=True)
            backoff.reset()
            await lost.wait()
            raise ConnectionError("channel closed")
        finally:
            for t in list(self.held):
                t.cancel()
            if not ch.is_closed:
                await _within_grace(ch.close())  # the held deliveries go back

    async def _answer_run(self, ch: AbstractChannel, cmd: AbstractIncomingMessage, mover: str) -> None:
        """A run's command: the held deliveries it selects counted, or (take)
        at most its limit of them, earliest due first, published to their
        work queue (confirmed) and acked; answered to its reply-to."""
        c = _core.run_command(cmd.headers)
        selected = sorted(((t, n) for t, n in self.waiting.items()
                           if _core.run_selects(c, self.held[t].message_id, self.held[t].headers)),
                          key=lambda tn: _core.due_of(self.held[tn[0]].headers))
        moved = 0
        for t, n in selected[:c.limit]:
            if t not in self.waiting:
                continue  # its time came meanwhile: the move has it
            msg = self.held[t]
            t.cancel()  # waiting for its time: it ends there
            pub = _core.run_publish(msg.headers)
            try:
                await self.alone.run(msg.message_id or "", lambda: _publish(ch, pub, msg))
                await msg.ack()
                moved += 1
            except Exception as e:
                if ch.is_closed:
                    return  # the delivery went back with the channel
                log.warning("delay mover: run of %s failed, it goes on delayed: %s", msg.message_id, e)
                again = asyncio.ensure_future(self._hold(ch, n, msg, _core.now_ms() - (1 << n) * 1000))
                self.held[again] = msg
                again.add_done_callback(lambda t: self.held.pop(t, None))
        if cmd.reply_to:
            reply = aio_pika.Message(b"", headers=_core.run_reply(len(selected), moved, mover),
                                     correlation_id=cmd.correlation_id)
            await ch.default_exchange.publish(reply, cmd.reply_to)

    async def _hold(self, ch: AbstractChannel, n: int, msg: AbstractIncomingMessage, received: int) -> None:
        key = msg.routing_key or ""
        me = asyncio.current_task()
        if me is not None:
            self.waiting[me] = n
        try:
            await asyncio.sleep(max(0, _core.release_ms(n, key, msg.headers, received) - _core.now_ms()) / 1000)
        finally:
            if me is not None:
                self.waiting.pop(me, None)
        while True:
            # The move; one returned is dead-lettered (unroutable), one
            # refused enters the delay again: neither keeps a place in the
            # prefetch. Only what is refused after that is held here.
            pubs = [_core.moved(n, key, msg.headers)]
            while pubs:
                pub = pubs.pop(0)
                try:
                    await self.alone.run(msg.message_id or "", lambda: _publish(ch, pub, msg))
                    await msg.ack()
                    return
                except aiormq.exceptions.DeliveryError as e:
                    result = "returned" if isinstance(e, aiormq.exceptions.PublishError) else "refused"
                    more = _core.after_move(n, pub, result, msg.headers, _core.now_ms())
                except Exception as e:
                    if ch.is_closed:
                        return  # the delivery went back with the channel
                    result, more = "failed: %s" % e, None
                if more is None:
                    break
                pubs = more + pubs
            log.warning("delay mover: move of %s from %s %s, trying again in %gs", msg.message_id, _core.hold(n),
                        result, _core.MOVE_RETRY_S)
            await asyncio.sleep(_core.MOVE_RETRY_S)


async def _publish(ch: AbstractChannel, pub: _core.Publish, src: Any, body: Optional[bytes] = None) -> None:
    """Publishes pub with the body and properties of ``src`` (a delivery,
    or for enqueue a dict: content_type), persistent, its headers fitted
    below the frame size (``_core.fit``), and waits for the broker's
    confirm, however long (a blocked connection: a memory alarm), never
    taking a wait for a refusal: an unroutable message raises
    ``PublishError``, a refused one (nack) ``DeliveryError``, a channel
    closed meanwhile (the outcome unknown) its own error."""
    if isinstance(src, dict):
        props = dict(src)
    else:
        body = src.body
        props = {k: getattr(src, k) for k in _core.PROPERTIES}
    if pub.message_id:
        props["message_id"] = pub.message_id  # the job id (a plain message may have none)
    msg = aio_pika.Message(body or b"", headers=_amqp_table(_core.fit(pub.headers)),
                           delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                           **{k: v for k, v in props.items() if v})
    if not props.get("message_id"):
        msg.message_id = _NO_ID
    x = ch.default_exchange if pub.exchange == "" else await ch.get_exchange(pub.exchange, ensure=False)
    await x.publish(msg, pub.routing_key, mandatory=True)


def _log_blocked(conn: AbstractConnection) -> None:
    """Logs once when the broker blocks the connection (with its reason)
    and once when it unblocks it. aiormq has no callback for it: its two
    frame handlers are wrapped on the instance (private names; without
    them aiormq's own warning remains)."""
    under = getattr(getattr(conn, "transport", None), "connection", None)
    for name, line in (("_Connection__handle_connection_blocked", None),
                       ("_Connection__handle_connection_unblocked", _core.UNBLOCKED)):
        orig = getattr(under, name, None)
        if orig is None:
            continue

        async def wrapped(frame: Any, orig: Any = orig, line: Optional[str] = line) -> None:
            log.warning(line or _core.blocked_message(getattr(frame, "reason", "")))
            await orig(frame)

        setattr(under, name, wrapped)


class _ByMessageId:
    """Publishes on one channel one at a time per message id: aiormq
    matches a return to its publish by message id, and two publishes of
    one id in flight (a job id reused by another queue, a duplicate) could
    take each other's return: a routable move dead-lettered, a returned
    one acked as moved (lost)."""

    def __init__(self) -> None:
        self._busy: Dict[str, "asyncio.Future[None]"] = {}  # message id -> its publish in flight ends

    async def run(self, mid: str, publish: Callable[[], Awaitable[None]]) -> None:
        """publish() (a message with id ``mid``) once no other of ``mid`` is
        in flight."""
        while mid in self._busy:
            await asyncio.shield(self._busy[mid])
        done = self._busy[mid] = asyncio.get_running_loop().create_future()
        try:
            await publish()
        finally:
            del self._busy[mid]
            done.set_result(None)


async def _within_grace(aw: Awaitable[Any]) -> None:
    """Awaits ``aw`` (an RPC on the way out: a consumer's cancel, a
    channel's close) in a task of its own, APPLY_GRACE_S at most, and
    drops what it raises: a connection the broker blocked (an alarm)
    answers no RPC until the alarm ends, and a stopping worker does not
    wait for that (its deliveries go back when the connection closes)."""
    t = asyncio.ensure_future(aw)
    t.add_done_callback(lambda t: t.cancelled() or t.exception())
    await asyncio.wait({t}, timeout=_core.APPLY_GRACE_S)


async def _until_stopped(aw: Awaitable[Any], stopping: asyncio.Event) -> Any:
    """Awaits ``aw`` (a publish and its confirm) with no timeout of its own
    while the worker runs (a connection blocked by an alarm only delays
    it: README, "A confirm is never timed out"); once ``stopping`` is set,
    APPLY_GRACE_S more at most, then raises TimeoutError."""
    t = asyncio.ensure_future(aw)
    s = asyncio.ensure_future(stopping.wait())
    try:
        await asyncio.wait({t, s}, return_when=asyncio.FIRST_COMPLETED)
        if not t.done() and not (await asyncio.wait({t}, timeout=_core.APPLY_GRACE_S))[0]:
            t.cancel()
            raise TimeoutError("no confirm within %gs of the worker's stop" % _core.APPLY_GRACE_S)
        return t.result()
    finally:
        s.cancel()


async def _give_back(ch: AbstractChannel, dlq: str, msgs: List[AbstractIncomingMessage]) -> None:
    """Gives dead letters looked at back to ``dlq`` as ``_core.refresh``
    says: returned in order, or published again (confirmed) and acked."""
    if not _core.refresh([m.headers for m in msgs]):
        for m in msgs:
            await m.nack(requeue=True)
        return
    for m in msgs:
        await _publish(ch, _core.refreshed(dlq, m.headers), m)
        await m.ack()


def _alive(conn: AbstractConnection) -> bool:
    # aio-pika marks a Connection closed only when close() is called; a lost
    # one shows in its transport (aiormq's connection).
    t = getattr(conn, "transport", None)
    return not conn.is_closed and t is not None and not t.connection.is_closed


def _amqp_table(v: Any) -> Any:
    # pamqp writes a byte array from a bytearray only, and reads a long
    # string that is not UTF-8 as bytes: carried on as a byte array.
    if isinstance(v, bytes):
        return bytearray(v)
    if isinstance(v, dict):
        return {k: _amqp_table(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_amqp_table(x) for x in v]
    return v


class _NoId(str):
    """An absent message_id that aiormq leaves alone: it gives every message
    without one a random id (to match returns to confirms), which would turn
    a malformed message without a job id into a replayable job. Truthy for
    aiormq's check, empty for pamqp, which then leaves the property out."""

    def __bool__(self) -> bool:
        return True


_NO_ID = _NoId("")
