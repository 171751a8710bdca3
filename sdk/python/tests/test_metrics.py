"""The process metrics: the shared sequence (testdata/metrics/sequence.json)
replayed through @policy.retry on a fake clock gives the exposition Go gives
(testdata/metrics/expected.prom), series for series."""

import json
import pathlib
import re

import pytest

prometheus_client = pytest.importorskip("prometheus_client")

import backstop  # noqa: E402
from backstop import _retry  # noqa: E402
from backstop._host import abi  # noqa: E402
from backstop.metrics import create_metrics  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[3] / "testdata" / "metrics"
SEQ = json.loads((ROOT / "sequence.json").read_text())


def samples(text: str) -> list:
    """The samples of an exposition with their labels sorted and numbers
    parsed (le="1.0" is le="1"), sorted; HELP lines and prometheus_client's
    _created series left out, counters' TYPE lines named without _total."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("# HELP"):
            continue
        if line.startswith("# TYPE"):
            # prometheus_client names a counter's family without _total.
            _, _, name, kind = line.split()
            if not name.endswith("_created"):
                out.append("# TYPE %s %s" % (name[:-6] if name.endswith("_total") else name, kind))
            continue
        m = re.match(r"^([^{ ]+)(?:\{(.*)\})? (\S+)$", line)
        assert m, line
        if m.group(1).endswith("_created"):
            continue
        labels = []
        for k, v in re.findall(r'([a-z_]+)="([^"]*)"', m.group(2) or ""):
            labels.append('%s="%s"' % (k, repr(float(v)) if k == "le" else v))
        out.append("%s{%s} %r" % (m.group(1), ",".join(sorted(labels)), float(m.group(3))))
    return sorted(out)


class HTTPError(Exception):
    def __init__(self, status: int, retry_after: str = "") -> None:
        super().__init__("HTTP %d" % status)
        self.status_code = status
        self.headers = {"Retry-After": retry_after} if retry_after else {}


def outcome(o: str):
    if o == "ok":
        return None
    if o == "timeout":
        return TimeoutError("timed out")
    _, status, *ra = o.split(":")
    return HTTPError(int(status), ra[0] if ra else "")


@pytest.fixture
def clock(monkeypatch):
    """A fake clock in whole milliseconds that only sleeps move."""
    now = [SEQ["start_ms"]]
    # +0.5 ms: int(t * 1000) gives back the whole millisecond.
    fake = lambda: (now[0] + 0.5) / 1000  # noqa: E731
    monkeypatch.setattr(abi, "_time", fake)
    # The generated fast path takes its clock when it is made: make one on the fake.
    monkeypatch.setattr(abi, "decide", abi.C.decider(fake, abi._draw, abi.decide_value, abi._UNUSUAL))
    monkeypatch.setattr(_retry, "_sleep", lambda s: now.__setitem__(0, now[0] + round(s * 1000)))
    # The retry latency (failure to the next start) is measured on it too.
    monkeypatch.setattr(_retry, "_monotonic", lambda: now[0] / 1000)
    return now


def test_shared_sequence_gives_the_series_go_gives(clock):
    registry = prometheus_client.CollectorRegistry()
    metrics = create_metrics(SEQ["policy_name"], SEQ["target"], registry)
    policy = backstop.load_policy(SEQ["policy"])
    for i, call in enumerate(SEQ["calls"]):
        clock[0] += call.get("advance_ms", 0)
        made = []

        @policy.retry(metrics=metrics)
        def fn():
            assert len(made) < len(call["outcomes"]), "call %d: attempt %d made" % (i, len(made) + 1)
            err = outcome(call["outcomes"][len(made)])
            made.append(1)
            if err is not None:
                raise err

        try:
            fn()
            got = "ok"
        except backstop.RetryError as e:
            got = e.reason
        assert (got, len(made)) == (call["want"], len(call["outcomes"])), "call %d" % i
    want = (ROOT / "expected.prom").read_text()
    assert samples(prometheus_client.generate_latest(registry).decode()) == samples(want)


def test_second_create_metrics_reuses_the_collectors():
    registry = prometheus_client.CollectorRegistry()
    create_metrics("a", "api", registry).attempt("success")
    create_metrics("a", "api", registry).attempt("success")
    assert registry.get_sample_value("backstop_client_attempts_total",
                                     {"policy": "a", "target": "api", "outcome": "success"}) == 2


@pytest.mark.parametrize("policy,target,match", [
    ("pay\ud800", "api", "policy 'pay\\\\ud800' is not valid UTF-8"),
    ("payments", "", "target must be a non-empty string"),
    ("payments", b"api", "target must be a non-empty string"),
])
def test_bad_labels(policy, target, match):
    with pytest.raises(ValueError, match=match):
        create_metrics(policy, target, prometheus_client.CollectorRegistry())


def test_registry_with_other_metrics_of_the_names():
    registry = prometheus_client.CollectorRegistry()
    prometheus_client.Counter("backstop_client_retries", "not ours", registry=registry)
    with pytest.raises(ValueError, match="register backstop_client_retries: the registry holds another metric"):
        create_metrics("payments", "api", registry)
    # All or nothing: the families registered before the clash are gone.
    assert registry.get_sample_value("backstop_client_attempts_total",
                                     {"policy": "payments", "target": "api", "outcome": "success"}) is None
    assert "backstop_client_attempts" not in str(list(registry.collect()))


def test_without_prometheus_client_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "prometheus_client", None)  # import fails
    with pytest.raises(ImportError, match="pip install prometheus-client"):
        create_metrics("payments", "api")
