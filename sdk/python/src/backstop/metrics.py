"""The process metrics (``backstop_client_*``) in prometheus_client.

The same families, labels and buckets as Go's ``retry.WithMetrics`` and
Node's ``createMetrics``. prometheus_client is optional: it is imported when
metrics are made, and ``create_metrics`` says how to install it if missing::

    from backstop.metrics import create_metrics

    metrics = create_metrics("payments", "charge-api")

    @policy.retry(metrics=metrics)
    def charge(order): ...
"""

import threading
import weakref
from typing import Any, Dict, Optional, Tuple

__all__ = ["Metrics", "create_metrics"]

#: The retry_delay_seconds buckets, as in Go (retry/metrics.go) and Node.
DELAY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_OUTCOMES = ("success", "retry", "dead_letter", "refused")
_STATES = ("closed", "open", "half_open")

# (attribute, kind, name without _total, help, extra labels)
_FAMILIES = (
    ("attempts", "Counter", "backstop_client_attempts",
     "Calls made (or refused) under a backstop policy, by outcome: success, retry, dead_letter, refused.", ("outcome",)),
    ("retries", "Counter", "backstop_client_retries", "Retries scheduled, by the policy's reason.", ("reason",)),
    ("refused", "Counter", "backstop_client_calls_refused",
     "Calls refused before they were made, by reason: circuit_open, budget_exhausted.", ("reason",)),
    ("delay", "Histogram", "backstop_client_retry_delay_seconds", "Delay scheduled before each retry.", ()),
    ("latency", "Histogram", "backstop_client_retry_latency_seconds",
     "Measured time from a failed attempt to the start of the next one "
     "(the decided delay is backstop_client_retry_delay_seconds).", ()),
    ("state", "Gauge", "backstop_client_circuit_state",
     "Circuit breaker state last seen by this process: 1 for the current state, 0 for the others.", ("state",)),
    ("transitions", "Counter", "backstop_client_circuit_transitions",
     "Circuit breaker state changes seen by this process.", ("from", "to")),
    ("budget", "Gauge", "backstop_client_budget_tokens",
     "Retry budget left as last seen by this process: a token bucket's tokens (retries pass while more than half remain), "
     "or the retries a window budget still allows. Absent without a budget.", ()),
)

# One registry's collectors, shared by every create_metrics on it.
_registries: "weakref.WeakKeyDictionary[Any, Dict[str, Any]]" = weakref.WeakKeyDictionary()
_lock = threading.Lock()


class Metrics:
    """The metrics of one policy and target: pass to ``policy.retry(metrics=...)``
    or a queue worker. Build one with ``create_metrics``."""

    __slots__ = ("policy", "target", "_fam", "_key")

    def __init__(self, policy: str, target: str, fam: Dict[str, Any]) -> None:
        self.policy, self.target, self._fam, self._key = policy, target, fam, (policy, target)

    def attempt(self, outcome: str) -> None:
        if outcome not in _OUTCOMES:
            raise ValueError("metrics: outcome must be one of %s (got %r)" % (", ".join(_OUTCOMES), outcome))
        self._fam["attempts"].labels(self.policy, self.target, outcome).inc()

    def retry(self, reason: str, delay_ms: int) -> None:
        self._fam["retries"].labels(self.policy, self.target, reason).inc()
        self._fam["delay"].labels(self.policy, self.target).observe(delay_ms / 1000)

    def latency(self, ms: float) -> None:
        """The measured time from a failed attempt to the start of the next
        one, in ms (negative counts as 0)."""
        self._fam["latency"].labels(self.policy, self.target).observe(max(0, ms) / 1000)

    def refused(self, reason: str) -> None:
        self._fam["attempts"].labels(self.policy, self.target, "refused").inc()
        self._fam["refused"].labels(self.policy, self.target, reason).inc()

    def budget(self, tokens: Optional[float]) -> None:
        """Records the retry budget left (``policy.budget_tokens()``); None
        (no budget) records nothing."""
        if tokens is not None:
            self._fam["budget"].labels(self.policy, self.target).set(tokens)

    def state(self, state: str) -> None:
        if state not in _STATES:
            return
        last: Dict[Tuple[str, str], str] = self._fam["last"]
        with _lock:
            prev = last.get(self._key)
            if prev == state:
                return
            last[self._key] = state
        for s in _STATES:
            self._fam["state"].labels(self.policy, self.target, s).set(1 if s == state else 0)
        if prev is not None:
            self._fam["transitions"].labels(self.policy, self.target, prev, state).inc()


def _label(name: str, v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise ValueError("create_metrics: %s must be a non-empty string (got %r)" % (name, v))
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("create_metrics: %s %r is not valid UTF-8 (a lone surrogate)" % (name, v)) from None
    return v


def create_metrics(policy: str, target: str, registry: Optional[Any] = None) -> Metrics:
    """The metrics of one policy and target in ``registry`` (default:
    prometheus_client's ``REGISTRY``). Choose both labels from a small fixed
    set (a dependency's name, never a URL or an id).

    A second call on the same registry reuses the collectors the first
    registered. Raises ValueError for an empty label, one that is not valid
    UTF-8, or a registry that holds other metrics under the same names;
    ImportError when prometheus_client is not installed.
    """
    _label("policy", policy)
    _label("target", target)
    try:
        import prometheus_client
    except ImportError as e:
        raise ImportError("create_metrics needs prometheus_client: pip install prometheus-client") from e
    if registry is None:
        registry = prometheus_client.REGISTRY
    with _lock:
        fam = _registries.get(registry)
        if fam is None:
            fam = register_families(registry, _FAMILIES, ("policy", "target"), DELAY_BUCKETS, "create_metrics")
            fam["last"] = {}
            _registries[registry] = fam
    return Metrics(policy, target, fam)


def register_families(registry: Any, families: Any, labels: Tuple[str, ...], buckets: Any, who: str) -> Dict[str, Any]:
    """Registers ``families`` ((attribute, kind, name, help, extra labels),
    each with ``labels`` first; histograms with ``buckets``) in
    ``registry``, all or nothing; their collectors by attribute."""
    import prometheus_client

    fam: Dict[str, Any] = {}
    try:
        for attr, kind, name, doc, extra in families:
            kw: Dict[str, Any] = {"registry": registry}
            if kind == "Histogram":
                kw["buckets"] = buckets
            try:
                fam[attr] = getattr(prometheus_client, kind)(name, doc, labels + extra, **kw)
            except ValueError as e:
                raise ValueError("%s: register %s: the registry holds another metric of that name (%s)"
                                 % (who, name, e)) from None
    except ValueError:
        for c in fam.values():  # all or nothing
            registry.unregister(c)
        raise
    return fam
