"""Clock skew between Redis workers (issue 40, as
queue/redisqueue/skew_internal_test.go in Go and test/queue-skew.test.js in
Node), against a real redis-server: the scripts stamp first_enqueued_ms and
due times with the server's TIME, so a worker whose clock is 30 s off must
still measure a job's elapsed time (max_elapsed) on the server's clock, and
no retry may run before its delay is over."""

import time

import pytest

import backstop
from backstop.redis import Queue

from conftest import server_time_ms, until
from test_queue_defer import Worker, counters

POLICY = {"max_attempts": 5, "max_elapsed": "20s", "backoff": {"strategy": "constant", "base": "200ms", "cap": "200ms"},
          "jitter": {"mode": "none"}}


class Unavailable(Exception):
    pass


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("skew", [30, -30], ids=["ahead", "behind"])
def test_skewed_worker_judges_the_time_budget_on_the_servers_clock(redis_server, r, monkeypatch, skew, use_async):
    """The worker's clock (time.time) is off; the server's is right. Before,
    a worker ahead dead-lettered fresh jobs as max_elapsed_exceeded (20 s
    budget), one behind retried jobs 25 s old, past their budget."""
    q = Queue(r, "skew")
    q.ensure_group()
    for i in range(4):
        q.enqueue("fresh-%d" % i, b"")
    old = server_time_ms(r) - 25000
    for i in range(2):
        r.xadd(q.keys.jobs, {"id": "old-%d" % i, "attempt": "1", "first_enqueued_ms": str(old), "payload": ""})
    spans = {}  # job id: [[start, end]] by the server's clock

    def handler(job):
        span = [server_time_ms(r), None]
        spans.setdefault(job.id, []).append(span)
        try:
            if job.attempt < 3:
                raise Unavailable("503 unavailable")
        finally:
            span[1] = server_time_ms(r)

    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + skew)
    with backstop.load_policy(POLICY) as p:
        w = Worker(redis_server.port, "skew", p, handler, use_async, batch=1, block_ms=20,
                   classify=lambda e: {"http_status": 503})
        try:
            until("every job to finish",
                  lambda: counters(r, q).get("attempts:success", 0) + counters(r, q).get("attempts:dead_letter", 0) == 6)
        finally:
            w.stop()
            monkeypatch.undo()
    c = counters(r, q)
    assert (c.get("attempts:success"), c.get("dead_letters:max_elapsed_exceeded")) == (4, 2), c
    for job_id, runs in spans.items():
        assert len(runs) == (1 if job_id.startswith("old") else 3), (job_id, runs)
        for before, after in zip(runs, runs[1:]):
            assert after[0] >= before[1] + 200, "%s ran before its 200 ms delay was over (server clock)" % job_id
