"""The WSGI app test_idempotency_wsgi.py serves with gunicorn (a process of
its own): IdempotencyWSGI over the Redis at $BACKSTOP_REDIS_PORT, keys under
$BACKSTOP_PREFIX, around an app that answers 201 with the RAW_URI gunicorn gave it."""

import os

import redis

from backstop.idempotency import IdempotencyStore, IdempotencyWSGI


def charges(environ, start_response):
    start_response("201 Created", [("Content-Type", "text/plain")])
    return [environ.get("RAW_URI", "(none)").encode("latin-1")]


app = IdempotencyWSGI(charges, IdempotencyStore(redis.Redis(port=int(os.environ["BACKSTOP_REDIS_PORT"])),
                                                prefix=os.environ["BACKSTOP_PREFIX"]))
