"""backstop: one retry policy for every language.

The policy core (backoff, jitter, error classification, Retry-After, retry
budgets, circuit breaker) runs in ``backstop.wasm`` under wasmtime, so a
Python service decides exactly as its Go and Node.js neighbours do::

    import backstop

    policy = backstop.load_policy("critical")
    d = policy.decide(attempt=1, http_status=503, retry_after="2")
    d.action, d.delay_ms, d.reason, d.klass   # ('retry', 2000, 'retry_after', 'retryable')

    @policy.retry
    def fetch(url): ...
"""

from ._deadline import DeadlineExceeded, attempt_time_left
from ._errors import BackstopError, InputError, LintWarning, PolicyError, RetryError
from ._layers import (OneLayerASGI, OneLayerWSGI, attempt_headers, current_attempt, grpc_attempt_metadata,
                      httpx_attempt_hook)
from ._host._contract import Lint
from ._policy import Decision, Failure, Outcome, Permit, Policy, load_policy
from ._retry import RetryState, describe
from ._host import ABI_VERSION, StateLostError

__all__ = [
    "ABI_VERSION",
    "BackstopError",
    "DeadlineExceeded",
    "Decision",
    "Failure",
    "InputError",
    "Lint",
    "LintWarning",
    "OneLayerASGI",
    "OneLayerWSGI",
    "Outcome",
    "Permit",
    "Policy",
    "PolicyError",
    "RetryError",
    "RetryState",
    "StateLostError",
    "attempt_headers",
    "attempt_time_left",
    "current_attempt",
    "describe",
    "grpc_attempt_metadata",
    "httpx_attempt_hook",
    "load_policy",
]
