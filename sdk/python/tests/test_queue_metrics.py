"""A queue worker with ``metrics`` exports the backstop_client_* families
@policy.retry does, with target = the queue's name (as queue/metrics_test.go
in Go and test/queue-metrics.test.js in Node), against a real redis-server:
a success, a failure that opens the breaker (deferred: a retry with reason
circuit_open), and a job the open breaker refuses before it runs."""

import pytest

import backstop
from backstop.metrics import create_metrics
from backstop.redis import Queue
from conftest import until
from test_queue_defer import Worker

prometheus_client = pytest.importorskip("prometheus_client")

POLICY = """{"max_attempts": 3, "backoff": {"base": "10ms", "cap": "20ms"}, "jitter": {"mode": "none"},
 "circuit_breaker": {"failure_threshold": 1, "open_for": "1h"}}"""


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_worker_counts_under_target_the_queue(redis_server, r, use_async):
    q = Queue(r, "orders")
    for job_id in ("job-ok", "job-fails", "job-refused"):
        q.enqueue(job_id, b"")
    registry = prometheus_client.CollectorRegistry()
    metrics = create_metrics("payments", "orders", registry)

    def value(name, **labels):
        return registry.get_sample_value(name, dict(policy="payments", target="orders", **labels))

    with backstop.load_policy(POLICY) as p:
        def handler(job):
            if job.id != "job-ok":
                raise ConnectionResetError("503")

        # One read takes all three: the worker stops reading once the breaker opens.
        w = Worker(redis_server.port, "orders", p, handler, use_async, batch=3, block_ms=20, metrics=metrics)
        try:
            until("a job refused", lambda: value("backstop_client_calls_refused_total", reason="circuit_open") == 1)
            got = {o: value("backstop_client_attempts_total", outcome=o) for o in ("success", "retry", "dead_letter", "refused")}
            assert got == {"success": 1, "retry": 1, "dead_letter": None, "refused": 1}
            assert value("backstop_client_retries_total", reason="circuit_open") == 1
            assert value("backstop_client_circuit_state", state="open") == 1
            assert value("backstop_client_circuit_transitions_total", **{"from": "closed", "to": "open"}) == 1
        finally:
            w.stop()


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_worker_exports_the_budget_left(redis_server, r, use_async):
    q = Queue(r, "orders")
    for job_id in ("job-1", "job-2"):
        q.enqueue(job_id, b"")
    registry = prometheus_client.CollectorRegistry()
    metrics = create_metrics("payments", "orders", registry)
    with backstop.load_policy({"retry_budget": {"max_tokens": 10, "token_ratio": 0.5}}) as p:
        def handler(job):
            raise ConnectionResetError("reset")

        w = Worker(redis_server.port, "orders", p, handler, use_async, batch=2, block_ms=20, metrics=metrics)
        try:
            # Two failures take a token each from 10.
            until("both jobs counted", lambda: registry.get_sample_value(
                "backstop_client_budget_tokens", {"policy": "payments", "target": "orders"}) == 8)
        finally:
            w.stop()


def test_metrics_for_another_target_are_refused(r):
    metrics = create_metrics("payments", "charge-api", prometheus_client.CollectorRegistry())
    with backstop.load_policy("default") as p:
        with pytest.raises(ValueError, match="metrics must have target 'orders', the queue's name"):
            Queue(r, "orders").work(p, lambda job: None, metrics=metrics)


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_stalled_promoter_shows_in_the_retry_latency(redis_server, r, use_async):
    """A retry whose promoter stalled shows in the measured retry latency
    (backstop_client_retry_latency_seconds: failure to the next attempt's
    start), not in the decided delay (as Go's
    TestRetryLatencyShowsStalledPromoter): the failed job's member, due in
    60 s, is moved 65 s back in the delayed set (it failed 65 s ago and was
    due 5 s ago, no promoter ran since); the worker's promote loop then
    moves it with its due time (due_ms)."""
    q = Queue(r, "latency")
    q.enqueue("job-1", b"")
    registry = prometheus_client.CollectorRegistry()
    metrics = create_metrics("payments", "latency", registry)

    def value(name):
        return registry.get_sample_value(name, {"policy": "payments", "target": "latency"})

    policy = {"max_attempts": 3, "backoff": {"strategy": "constant", "base": "60s"}, "jitter": {"mode": "none"}}
    with backstop.load_policy(policy) as p:
        attempts = []

        def handler(job):
            attempts.append(job.attempt)
            if job.attempt == 1:
                raise ConnectionResetError("reset")

        w = Worker(redis_server.port, "latency", p, handler, use_async, batch=1, block_ms=20, metrics=metrics)
        try:
            until("the failed job in the delayed set", lambda: r.zcard("{latency}:delayed") == 1)
            member = r.zrange("{latency}:delayed", 0, 0)[0]
            r.zincrby("{latency}:delayed", -65000, member)
            until("the retry latency recorded", lambda: value("backstop_client_retry_latency_seconds_count") == 1)
            assert attempts == [1, 2]
            assert value("backstop_client_retry_delay_seconds_sum") == 60
            assert value("backstop_client_retry_latency_seconds_sum") >= 65
        finally:
            w.stop()
