"""Issue 43: the slow-call rate. Every call succeeds, each slower than the
policy's slow_call_duration_threshold: the retry loop and the Redis worker
measure each call and report it, so the breaker opens on successes alone.
A call spins at least 3 ms against a 1 ms threshold: a lower bound on the
clock, never an upper one."""

import time

import pytest

import backstop
from backstop.redis import Queue

from conftest import until
from test_queue_defer import Worker, counters

SLOW = {"circuit_breaker": {"type": "failure_rate", "slow_call_rate_threshold": 100,
                            "slow_call_duration_threshold": "1ms", "sliding_window": {"size": 5},
                            "minimum_calls": 5, "open_for": "1h"}}


def spin():
    start = time.monotonic()
    while time.monotonic() - start < 0.003:
        pass


def test_retry_slow_successes_open_the_breaker():
    with backstop.load_policy(SLOW) as p:
        for _ in range(5):
            assert p.retry(lambda: spin() or "ok")() == "ok"
        ran = []
        with pytest.raises(backstop.RetryError) as e:
            p.retry(lambda: ran.append(1))()
        assert e.value.reason == "circuit_open" and ran == []


def test_record_duration_is_validated_and_ignored_without_a_slow_call_rate():
    with backstop.load_policy(SLOW) as p:
        with pytest.raises(backstop.InputError, match="duration_ms: must be >= 0"):
            p.record_duration(-1)
    with backstop.load_policy({"circuit_breaker": {"type": "failure_rate"}}) as plain:
        for _ in range(200):
            plain.record_duration(10**9)
        assert plain.circuit_state() == "closed"


def test_record_duration_stops_calling_once_the_module_says_it_never_counts():
    """record_duration (generated): a policy whose answer is 1 (no slow-call
    rate, and never one) is not called again; a stateless one never is, a
    policy with a slow-call rate each time; a closed one raises."""
    from backstop._host.runtime import Instance
    from backstop._policy import load_into

    inst = Instance()
    calls = []
    real = inst.record_duration
    inst.record_duration = lambda *a: calls.append(a[0]) or real(*a)
    with load_into(inst, '{"circuit_breaker": {"type": "failure_rate"}}') as plain, load_into(inst, "default") as stateless, \
            load_into(inst, __import__("json").dumps(SLOW)) as slow:
        for p in (plain, stateless, slow):
            for _ in range(3):
                p.record_duration(5, 1767225600000)
        assert calls == [plain._h] + [slow._h] * 3
        with pytest.raises(backstop.InputError, match=r"^duration_ms: must be >= 0 \(got -1\)$"):
            stateless.record_duration(-1)
        stateless.close()
        with pytest.raises(backstop.BackstopError, match="closed"):
            stateless.record_duration(5)


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_worker_slow_successes_open_the_breaker(redis_server, r, use_async):
    name = "slow-" + ("async" if use_async else "sync")
    q = Queue(r, name)
    for i in range(6):
        q.enqueue("job-%d" % i, b"")
    ran = [0]
    with backstop.load_policy(SLOW) as p:
        def handler(job):
            ran[0] += 1
            spin()

        w = Worker(redis_server.port, name, p, handler, use_async, batch=1, block_ms=20)
        try:
            until("the sixth job deferred", lambda: counters(r, q).get("deferred:circuit_open") == 1)
            assert ran[0] == 5 and counters(r, q).get("attempts:success") == 5
        finally:
            w.stop()
