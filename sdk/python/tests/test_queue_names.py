"""The queue's names, aligned with Go's: ``backstop.queue`` is
broker-neutral, ``backstop.redis`` the Redis queue; the old Redis imports
from ``backstop.queue`` keep working, deprecated."""

import subprocess
import sys
import warnings

import pytest

import backstop.queue
import backstop.redis

OLD = ["AsyncHandler", "AsyncQueue", "Handler", "Job", "Keys", "Outcome", "Payload", "Promoted", "Queue", "Ran",
       "Reclaimed", "Stats", "script_source", "log"]


@pytest.mark.parametrize("name", OLD)
def test_old_redis_names_still_import_from_backstop_queue_with_a_deprecation_warning(name):
    with pytest.warns(DeprecationWarning, match=r"backstop\.queue\.%s is deprecated: use backstop\.redis\.%s" % (name, name)):
        got = getattr(backstop.queue, name)
    assert got is getattr(backstop.redis, name)


def test_from_import_of_the_old_names_works_and_warns_at_the_importer():
    with pytest.warns(DeprecationWarning) as rec:
        from backstop.queue import Queue, Job  # noqa: F401
    assert Queue is backstop.redis.Queue and Job is backstop.redis.Job
    assert {w.filename for w in rec} == {__file__}  # stacklevel: the line that imports


def test_the_broker_neutral_names_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from backstop.queue import ACTIONS, JobLike, check_job_type, error_text  # noqa: F401
    assert ACTIONS == ("run", "ack", "retry", "defer", "dead_letter")
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        backstop.queue.Nope  # noqa: B018


def test_both_brokers_jobs_have_the_neutral_shape():
    from backstop.rabbitmq import Job as RabbitJob
    for cls in (backstop.redis.Job, RabbitJob):
        for attr in ("id", "attempt", "first_enqueued_ms", "prev_delay_ms", "malformed", "job_type"):
            assert attr in getattr(cls, "__dataclass_fields__", {}) or hasattr(cls, attr), (cls, attr)


def test_the_broker_neutral_module_needs_no_broker_client():
    out = subprocess.run([sys.executable, "-c", "import sys, backstop.queue; "
                          "print(sorted(m for m in ('redis', 'aio_pika', 'pika') if m in sys.modules))"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
