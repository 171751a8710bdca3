"""backstop.rabbitmq.sync: ``backstop.rabbitmq`` for threads, over pika's
BlockingConnection, with the same topology, headers and moves::

    from backstop.rabbitmq import sync

    broker = sync.connect("amqp://guest:guest@127.0.0.1:5672/")
    q = broker.queue("emails")
    q.enqueue("job-1", b'{"to": "a@example.com"}', job_type="send_email")
    q.work(policy, handle, stop=stop_event)   # until stop is set; the job in hand finishes first

Needs the ``rabbitmq`` extra: ``pip install 'backstop-policy[rabbitmq]'``.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta
from typing import Any, Callable, Dict, List, Mapping, Optional, Set, Tuple, Union

try:
    import pika
    import pika.exceptions
    from pika.adapters.blocking_connection import BlockingChannel
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("backstop.rabbitmq.sync needs pika: pip install 'backstop-policy[rabbitmq]'") from e

from .. import queue as _queue
from .. import _decide, _redact
from .._deadline import run_within
from .._policy import Policy
from .._retry import Classify
from . import _core, _work
from ._core import DeadLetter, Job, Stats
from ._metrics import QueueMetrics

__all__ = ["Broker", "DeadLetter", "Job", "Queue", "Stats", "connect"]

log = logging.getLogger("backstop.rabbitmq")

Handler = Callable[[Job], Any]

_POLL = 0.2  # seconds between looks at stop while the queue is idle

# What a lost connection or channel raises: the worker connects again.
_LOST = (pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError, pika.exceptions.StreamLostError,
         ConnectionError, OSError)


def connect(url: str) -> "Broker":
    """Connects to the broker at ``url`` (``amqp://user:pass@host:port/vhost``).
    Each ``work`` opens its own connection (a BlockingConnection belongs to
    one thread) and opens it again with backoff when it is lost; the
    other methods share this one, opened again on their next call."""
    if not isinstance(url, str) or not url:
        raise ValueError("connect: url must be a non-empty amqp:// URL (got %r)" % (url,))
    b = Broker(url)
    with b._lock:
        b._connection()
    return b


class Broker:
    """A connection to one RabbitMQ virtual host. Make it with ``connect``.
    Its methods are safe to call from several threads (one at a time)."""

    def __init__(self, url: str) -> None:
        self.url = url
        try:
            self._params = pika.URLParameters(url)
        except Exception as e:
            clean = _redact.error(e, url)  # urllib's errors quote parts of a bad URL
            if clean is e:
                raise
            raise clean from None
        self._conn: Optional[pika.BlockingConnection] = None
        self._lock = threading.RLock()
        self._declared: Set[str] = set()  # queues declared on self._conn ("" = the shared levels)
        self._closed = False

    def __repr__(self) -> str:
        return "Broker(%r)" % (self._params.host,)

    def queue(self, name: str, *, max_deliveries: int = 5) -> "Queue":
        """See ``backstop.rabbitmq.Broker.queue``."""
        return Queue(self, _core.check_name("queue", "name", name),
                     _core.check_int("queue", "max_deliveries", max_deliveries, 1, 1000))

    def close(self) -> None:
        """Closes the shared connection; running workers stop at their next
        look at it (set their ``stop`` to finish them first)."""
        with self._lock:
            self._closed = True
            if self._conn is not None and self._conn.is_open:
                try:
                    self._conn.close()
                except _LOST:
                    pass  # lost meanwhile (a missed heartbeat while idle): closed all the same

    def __enter__(self) -> "Broker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _connection(self) -> pika.BlockingConnection:
        if self._closed:
            raise RuntimeError("rabbitmq: the broker connection is closed")
        if self._conn is None or not self._conn.is_open:
            self._conn = _open(self._params)
            self._declared = set()
        return self._conn

    def _channel(self) -> BlockingChannel:
        ch = self._connection().channel()
        ch.confirm_delivery()
        return ch


def _open(params: pika.URLParameters) -> pika.BlockingConnection:
    """A connection that logs once when the broker blocks it (a memory or
    disk alarm: publishes and their confirms wait) and once when it
    unblocks it."""
    conn = pika.BlockingConnection(params)
    conn.add_on_connection_blocked_callback(
        lambda _, frame: log.warning(_core.blocked_message(getattr(frame.method, "reason", ""))))
    conn.add_on_connection_unblocked_callback(lambda *_: log.warning(_core.UNBLOCKED))
    return conn


def _declare(ch: BlockingChannel, topo: _core.Topology) -> None:
    for name, kind in topo.exchanges:
        ch.exchange_declare(name, kind, durable=True)
    for name, args in topo.queues:
        ch.queue_declare(name, durable=True, arguments=args)
    for queue, exchange, key, args in topo.queue_bindings:
        ch.queue_bind(queue, exchange, key, arguments=args or None)
    for dest, source, key, args in topo.exchange_bindings:
        ch.exchange_bind(dest, source, key, arguments=args or None)
    for queue, exchange, key in topo.queue_unbindings:
        ch.queue_unbind(queue, exchange, key)


def _declare_queue(ch: BlockingChannel, declared: Set[str], name: str, max_deliveries: int) -> None:
    if "" not in declared:
        _declare(ch, _core.SHARED)
        declared.add("")
    if name not in declared:
        _declare(ch, _core.topology(name, max_deliveries))
        declared.add(name)


def _publish(ch: BlockingChannel, pub: _core.Publish, body: bytes, src: Optional[pika.BasicProperties] = None,
             **props: Any) -> None:
    """Publishes pub with ``body`` and the properties of ``src`` (a
    delivery's; else ``props``), persistent, its headers fitted below the
    frame size (``_core.fit``). Confirm mode: returns once the broker
    confirmed, however long that takes (a blocked connection: a memory
    alarm); raises when it refused (NackError) or could not route
    (UnroutableError, mandatory), or the connection was lost (the outcome
    unknown)."""
    if src is not None:
        props = {k: getattr(src, k) for k in _core.PROPERTIES}
    if pub.message_id:
        props["message_id"] = pub.message_id  # the job id (a plain message may have none)
    p = pika.BasicProperties(headers=_core.fit(pub.headers), delivery_mode=2, **{k: v for k, v in props.items() if v})
    ch.basic_publish(pub.exchange, pub.routing_key, body, properties=p, mandatory=True)


class Queue:
    """One work queue with its DLQ and delays (``Broker.queue``)."""

    def __init__(self, broker: Broker, name: str, max_deliveries: int) -> None:
        self.broker = broker
        self.name = name
        self.max_deliveries = max_deliveries

    def __repr__(self) -> str:
        return "Queue(%r, max_deliveries=%d)" % (self.name, self.max_deliveries)

    def _op(self, fn: Callable[[BlockingChannel], Any]) -> Any:
        b = self.broker
        with b._lock:
            try:
                ch = b._channel()
            except _LOST:
                # A BlockingConnection learns that it was lost (a broker
                # restart) only when it is used: open it again, once.
                b._conn = None
                ch = b._channel()
            try:
                _declare_queue(ch, b._declared, self.name, self.max_deliveries)
                return fn(ch)
            finally:
                if ch.is_open:
                    ch.close()

    def declare(self) -> None:
        """See ``backstop.rabbitmq.Queue.declare``."""
        self._op(lambda ch: None)

    def enqueue(self, job_id: str, payload: _core.Payload = b"", job_type: Optional[str] = None, *,
                content_type: Optional[str] = None, delay: Union[None, float, timedelta] = None) -> None:
        """See ``backstop.rabbitmq.Queue.enqueue``."""
        _core.check_name("enqueue", "job_id", job_id)
        body = _core.payload_bytes(payload)
        if job_type is not None:
            _queue.check_job_type("enqueue", "job_type", job_type)
        wait = _core.delay_ms("enqueue", delay)
        self._op(lambda ch: _publish(ch, _core.enqueued(self.name, job_id, job_type, wait, _core.now_ms()), body,
                                     content_type=content_type))

    def work(self, policy: Policy, handler: Handler, *, stop: Optional[threading.Event] = None, prefetch: int = 16,
             registry: Any = None, metrics_policy: str = "default", classify: Optional[Classify] = None,
             policies: Optional[Mapping[str, Policy]] = None,
             handler_timeout: Union[None, float, timedelta] = None, on_outcome: Any = None) -> None:
        """``backstop.rabbitmq.Queue.work`` for a thread (``policies``: a
        job type's own policy, as there): runs
        ``handler(job)`` one job at a time until ``stop`` is set, then
        finishes the jobs already delivered to it and returns. pika reads
        an AMQP float header as an integer (1.5 as 1): a float
        ``backstop-attempt``, malformed for the asyncio worker, runs here. A job
        delivered in the moment of stopping is returned to the queue (the
        broker counts it in ``x-delivery-count``). Reconnects with backoff;
        keeps outcomes across a lost connection. Each handler runs in a
        thread of its own while the worker keeps its connection going
        (heartbeats answered: a long job is not delivered again), within
        ``handler_timeout`` seconds (default 5 minutes, below the broker's
        ``consumer_timeout``, 30 minutes by default); at the deadline the
        thread is abandoned (it runs on, its result dropped; logged) and
        the job fails with ``backstop.DeadlineExceeded`` (error kind
        ``timeout``). While it runs, a mover on a connection of
        its own (a daemon thread) moves the delayed messages of every queue
        of the virtual host down the delay levels (as the asyncio
        worker's). ``on_outcome`` as the asyncio worker's, called in the
        worker's thread."""
        runner, timeout, qm, kept, backoff = _work.setup(log, self.name, policy, handler, prefetch, classify, registry,
                                                         metrics_policy, policies, handler_timeout, on_outcome)
        stop = stop or threading.Event()
        mover = _Mover(self.broker)
        try:
            while not stop.is_set() and not self.broker._closed:
                try:
                    self._consume(runner, handler, stop, prefetch, timeout, qm, kept, backoff)
                    return
                except _LOST as e:
                    if isinstance(e, pika.exceptions.ChannelClosedByBroker) and e.reply_code in (403, 404, 406):
                        raise  # a topology the broker refuses (other arguments, no permission) stays refused
                    pause = backoff.next()
                    log.warning("queue %s: connection lost, connecting again in %.1fs: %s", self.name, pause, e)
                    stop.wait(pause)
        finally:
            mover.stop()

    def _consume(self, runner: _decide.Runner, handler: Handler, stop: threading.Event, prefetch: int, timeout: float,
                 qm: Optional[QueueMetrics], kept: _core.Kept, backoff: _core.Backoff) -> None:
        conn = _open(self.broker._params)
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            ch.basic_qos(prefetch_count=prefetch)
            _declare_queue(ch, set(), self.name, self.max_deliveries)
            gen = ch.consume(self.name, inactivity_timeout=_POLL)
            backoff.reset()
            left: Optional[int] = None  # after stop: the deliveries still to finish
            while True:
                if left is None and stop.is_set():
                    left = ch.get_waiting_message_count()
                if left is not None and left <= 0:
                    ch.cancel()
                    return
                method, props, body = next(gen)
                if method is None:
                    continue
                if left is not None:
                    left -= 1
                try:
                    self._deliver(conn, ch, method, props, body, runner, handler, timeout, qm, kept)
                except _LOST:
                    raise
                except Exception:
                    # As the asyncio worker: returned, and a crash loop if it
                    # keeps failing here.
                    log.exception("queue %s: delivery not handled; the broker delivers it again", self.name)
                    ch.basic_nack(method.delivery_tag, requeue=True)
        finally:
            if conn.is_open:
                try:
                    conn.close()
                except Exception:
                    pass

    def _deliver(self, conn: pika.BlockingConnection, ch: BlockingChannel, method: Any, props: Any, body: bytes,
                 runner: _decide.Runner, handler: Handler, timeout: float, qm: Optional[QueueMetrics],
                 kept: _core.Kept) -> None:
        name = self.name
        job = _core.job_from(name, props.message_id, props.headers, body, props.content_type, props.timestamp,
                             redelivered=bool(method.redelivered))
        policy, client = runner.policy_for(job)
        step = _core.triage(job, policy, self.max_deliveries, kept, _core.now_ms())
        plan: Optional[_decide.Plan] = step.plan
        pub: Optional[_core.Publish] = _core.before_run(name, job, step, _core.now_ms())
        if pub is None:
            if plan is None:
                runner.measure(client, job, _core.now_ms())
                exc: Optional[Exception] = None
                started = time.monotonic()
                try:
                    _run(conn, lambda: handler(job), timeout)
                except Exception as e:
                    exc = runner.failure(job, e)
                plan = runner.plan(job, exc, policy, _core.now_ms(), took=time.monotonic() - started)
                runner.count(client, policy, job, plan)
            elif step.gated:
                runner.count(client, policy, job, plan)
            pub = _core.move(name, job, plan, _core.now_ms())
        published = step.published
        try:
            if pub is not None and not published:
                _publish(ch, pub, body, props)
                published = True
            ch.basic_ack(method.delivery_tag)
        except (pika.exceptions.NackError, pika.exceptions.UnroutableError) as e:
            # Refused: kept, and the delivery handed back after a pause (as
            # the asyncio worker's), not held while the channel lives.
            n = step.refusals + 1
            if plan is not None:
                kept.keep(job, plan, published, n)
            pause = _core.refused_pause(n)
            log.warning("queue %s: outcome of job %s (attempt %d) refused by the broker, kept; handed back in "
                        "%.2fs: %s", name, job.id, job.attempt, pause, e)
            conn.call_later(pause, lambda: ch.basic_nack(method.delivery_tag, requeue=True) if ch.is_open else None)
            return
        except _LOST:
            if plan is not None:
                kept.keep(job, plan, published)
            log.warning("queue %s: outcome of job %s (attempt %d) not applied, kept for its redelivery",
                        name, job.id, job.attempt)
            raise
        if plan is not None and qm is not None:
            qm.observe(job, plan)
        if plan is not None and runner.on_outcome is not None:
            _queue.tell(runner.on_outcome, runner.event(job, plan), log)

    def run(self, job_id: Optional[str] = None, *, due_before: Union[None, int, datetime] = None,
            limit: Optional[int] = None) -> _core.Ran:
        """See ``backstop.rabbitmq.Queue.run``."""
        cmd = _core.run_args(self.name, job_id, due_before, limit)

        def run(ch: BlockingChannel) -> _core.Ran:
            moved = left = 0
            scan = 100_000
            for level in _core.RUN_LEVELS:
                held: List[Any] = []
                try:
                    while scan > 0:
                        method, props, body = ch.basic_get(level, auto_ack=False)
                        if method is None:
                            break
                        scan -= 1
                        if not _core.run_selects(cmd, props.message_id, props.headers):
                            held.append((method, props, body))
                        elif moved >= cmd.limit:
                            left += 1
                            held.append((method, props, body))
                        else:
                            _publish(ch, _core.run_publish(props.headers), body, props)
                            ch.basic_ack(method.delivery_tag)
                            moved += 1
                finally:
                    _give_back(ch, level, held)
            movers = ch.queue_declare(_core.hold(0), passive=True).method.consumer_count
            if movers == 0:
                return _core.Ran(moved, left)
            replies: List[Any] = []
            tag = ch.basic_consume("amq.rabbitmq.reply-to", lambda c, m, p, b: replies.append(p), auto_ack=True)

            def ask(exchange: str, key: str, op: str, corr: str, n: int, want: int) -> None:
                replies.clear()
                ch.basic_publish(exchange, key, b"", pika.BasicProperties(
                    reply_to="amq.rabbitmq.reply-to", correlation_id=corr, headers=_core.run_ask(cmd, op, n)))
                deadline = time.monotonic() + _core.RUN_WAIT_S
                while len(replies) < want and time.monotonic() < deadline:
                    ch.connection.process_data_events(time_limit=0.05)

            try:
                ask(_core.RUN, "", "count", "count", 0, movers)
                takes = _core.run_movers([p.headers for p in replies], movers, cmd.limit, _core.Ran(moved, left))
                take = next(takes)
                while True:
                    ask("", take[0], "take", "take", take[1], 1)
                    take = takes.send(replies[0].headers if replies else None)
            except StopIteration as done:
                return done.value
            finally:
                ch.basic_cancel(tag)

        return self._op(run)

    def replay(self, limit: int = 1000, reason: Optional[str] = None, keep_attempts: bool = False, *,
               scan: Optional[int] = None, actor: Optional[str] = None) -> int:
        """See ``backstop.rabbitmq.Queue.replay``."""
        limit, reason, scan = _core.replay_args(limit, reason, scan)
        actor = _core.check_actor("replay", actor)

        def run(ch: BlockingChannel) -> int:
            held: List[Any] = []
            moved = 0
            if actor:
                ch.queue_declare(self.name + ".audit", durable=True, arguments=_core.AUDIT_ARGUMENTS)
            for _ in range(scan):
                if moved >= limit:
                    break
                method, props, body = ch.basic_get(self.name + ".dlq", auto_ack=False)
                if method is None:
                    break
                d = _core.dead_letter_from(props.message_id, props.headers, body)
                if not _core.matches(d, reason):
                    held.append((method, props, body))
                    continue
                if actor:  # the record first: never a replay unrecorded
                    _publish(ch, _core.replay_record(self.name, d, actor, _core.now_ms()), b"", props)
                _publish(ch, _core.replayed(self.name, d, keep_attempts, _core.now_ms()), body, props)
                ch.basic_ack(method.delivery_tag)
                moved += 1
            _give_back(ch, self.name + ".dlq", held)
            return moved

        return int(self._op(run))

    def inspect(self, n: int = 20) -> List[DeadLetter]:
        """See ``backstop.rabbitmq.Queue.inspect``."""
        _core.check_int("inspect", "n", n, 1, 10000)

        def run(ch: BlockingChannel) -> List[DeadLetter]:
            out: List[DeadLetter] = []
            held: List[Any] = []
            for _ in range(n):
                method, props, body = ch.basic_get(self.name + ".dlq", auto_ack=False)
                if method is None:
                    break
                held.append((method, props, body))
                out.append(_core.dead_letter_from(props.message_id, props.headers, body))
            _give_back(ch, self.name + ".dlq", held)
            return out

        return list(self._op(run))

    def stats(self) -> Stats:
        """See ``backstop.rabbitmq.Queue.stats``."""
        b = self.broker
        with b._lock:
            ch = b._connection().channel()
            try:
                q = ch.queue_declare(self.name, passive=True).method
                d = ch.queue_declare(self.name + ".dlq", passive=True).method
                levels = 0
                for name in [_core.hold(n) for n in range(_core.HOLD_LEVELS)] + [_core.level(n) for n in range(_core.LEVELS)]:
                    try:
                        levels += ch.queue_declare(name, passive=True).method.message_count
                    except pika.exceptions.ChannelClosedByBroker:
                        ch = b._connection().channel()  # a missing level closed it
                return Stats(q.message_count, q.consumer_count, d.message_count, levels)
            finally:
                if ch.is_open:
                    ch.close()


def _give_back(ch: BlockingChannel, dlq: str, held: List[Any]) -> None:
    """``backstop.rabbitmq._give_back`` on a channel in confirm mode:
    ``held`` the (method, properties, body) of dead letters looked at."""
    if not _core.refresh([props.headers for _, props, _ in held]):
        for method, _, _ in held:
            ch.basic_nack(method.delivery_tag, requeue=True)
        return
    for method, props, body in held:
        _publish(ch, _core.refreshed(dlq, props.headers), body, props)
        ch.basic_ack(method.delivery_tag)


def _run(conn: pika.BlockingConnection, fn: Callable[[], Any], timeout: float) -> Any:
    """fn() in a thread within timeout (run_within) while conn goes on
    processing its events (heartbeats; deliveries wait in the consumer's
    buffer). A connection lost meanwhile is left for the outcome's publish
    to find (the outcome is kept for the redelivery)."""
    lost: List[BaseException] = []

    def wait(done: threading.Event, left: float) -> None:
        if not lost:
            try:
                conn.process_data_events(time_limit=left)  # woken when fn ends
                return
            except _LOST as e:
                lost.append(e)
        done.wait(left)

    return run_within(fn, timeout, "handler", wait, lambda: conn.add_callback_threadsafe(_nothing))


def _nothing() -> None:
    pass


class _Mover:
    """``backstop.rabbitmq._Mover`` for a worker thread: on a connection of
    its own (pika's are not thread-safe) in a daemon thread, it consumes
    ``hold.L0..L10`` (confirm mode, manual acks), holds each delivery until
    ``_core.release_ms`` (a timer of the connection), publishes it
    unchanged to its next exchange, waits for the confirm and acks it; a
    move the broker returns or refuses goes on as ``_core.after_move``
    says (as the asyncio mover's). A lost connection returns the held
    deliveries by itself; the mover connects again with backoff until
    ``stop``."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._stop = threading.Event()
        self.conn: Optional[pika.BlockingConnection] = None
        self.channel: Optional[BlockingChannel] = None
        self.held = 0
        # The deliveries waiting for their time, by timer: what a run may take.
        self.waiting: Dict[Any, Tuple[int, Any, Any, bytes, Callable[[], None]]] = {}
        self.thread = threading.Thread(target=self._run, name="backstop-delay-mover", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Stops it and waits: its connection closes, and what it held goes
        back to the levels."""
        self._stop.set()
        self.thread.join()

    def _run(self) -> None:
        backoff = _core.Backoff()
        while not self._stop.is_set() and not self.broker._closed:
            try:
                self._session(backoff)
            except _LOST as e:
                pause = backoff.next()
                log.warning("delay mover: connection lost, connecting again in %.1fs: %s", pause, e)
                self._stop.wait(pause)
            except Exception:  # pragma: no cover - a bug: logged, and the mover goes on
                log.exception("delay mover: session failed")
                self._stop.wait(backoff.next())

    def _session(self, backoff: _core.Backoff) -> None:
        conn = _open(self.broker._params)
        self.conn, self.held = conn, 0
        self.waiting.clear()
        try:
            ch = conn.channel()
            self.channel = ch
            ch.confirm_delivery()
            ch.basic_qos(prefetch_count=_core.MOVE_PREFETCH)
            _declare(ch, _core.SHARED)  # the hold queues
            for n in range(_core.HOLD_LEVELS):
                ch.basic_consume(_core.hold(n), self._on_message(conn, ch, n))
            # Run's commands (README, "Run a delayed job now"): a queue of
            # this channel's own on the run exchange.
            commands = ch.queue_declare("", exclusive=True, auto_delete=True).method.queue
            ch.queue_bind(commands, _core.RUN)
            ch.basic_consume(commands, self._on_command(conn, ch, commands), auto_ack=True)
            backoff.reset()
            while not self._stop.is_set() and not self.broker._closed:
                conn.process_data_events(time_limit=_POLL)
                if not ch.is_open:
                    raise pika.exceptions.ChannelClosed(0, "the mover's channel closed")
        finally:
            if conn.is_open:
                try:
                    conn.close()  # the held deliveries go back
                except Exception:
                    pass

    def _on_message(self, conn: pika.BlockingConnection, ch: BlockingChannel,
                    n: int) -> Callable[[BlockingChannel, Any, Any, bytes], None]:
        def take(_: BlockingChannel, method: Any, props: Any, body: bytes) -> None:
            key = method.routing_key or ""
            pub = _core.moved(n, key, props.headers)
            at = _core.release_ms(n, key, props.headers, _core.now_ms())

            def move() -> None:
                self.waiting.pop(timer[0], None)
                # The move; one returned is dead-lettered (unroutable), one
                # refused enters the delay again: neither keeps a place in
                # the prefetch. Only what is refused after that is held.
                pubs = [pub]
                while pubs:
                    if not ch.is_open:
                        return  # the delivery went back with the channel
                    p = pubs.pop(0)
                    try:
                        _publish(ch, p, body, props)
                    except (pika.exceptions.NackError, pika.exceptions.UnroutableError) as e:
                        result = "refused" if isinstance(e, pika.exceptions.NackError) else "returned"
                        more = _core.after_move(n, p, result, props.headers, _core.now_ms())
                        if more is None:
                            break
                        pubs = more + pubs
                        continue
                    ch.basic_ack(method.delivery_tag)
                    self.held -= 1
                    return
                log.warning("delay mover: move of %s from %s %s, trying again in %gs", props.message_id,
                            _core.hold(n), result, _core.MOVE_RETRY_S)
                conn.call_later(_core.MOVE_RETRY_S, move)

            self.held += 1
            timer = [conn.call_later(max(0, at - _core.now_ms()) / 1000, move)]
            self.waiting[timer[0]] = (n, method, props, body, move)

        return take

    def _on_command(self, conn: pika.BlockingConnection, ch: BlockingChannel,
                    mover: str) -> Callable[[BlockingChannel, Any, Any, bytes], None]:
        def answer(_: BlockingChannel, method: Any, cprops: Any, cbody: bytes) -> None:
            # The held deliveries a run selects counted, or (take) at most its
            # limit of them, earliest due first, published to their work
            # queue (confirmed) and acked; answered to its reply-to.
            c = _core.run_command(cprops.headers)
            selected = sorted(((t, w) for t, w in self.waiting.items() if _core.run_selects(c, w[2].message_id, w[2].headers)),
                              key=lambda tw: _core.due_of(tw[1][2].headers))
            moved = 0
            for t, (n, dmethod, props, body, move) in selected[:c.limit]:
                if self.waiting.pop(t, None) is None:
                    continue
                conn.remove_timeout(t)
                try:
                    _publish(ch, _core.run_publish(props.headers), body, props)
                    ch.basic_ack(dmethod.delivery_tag)
                    self.held -= 1
                    moved += 1
                except (pika.exceptions.NackError, pika.exceptions.UnroutableError) as e:
                    log.warning("delay mover: run of %s failed, it goes on delayed: %s", props.message_id, e)
                    move()  # on down the levels, due now
            if cprops.reply_to:
                ch.basic_publish("", cprops.reply_to, b"", pika.BasicProperties(
                    correlation_id=cprops.correlation_id, headers=_core.run_reply(len(selected), moved, mover)))

        return answer
