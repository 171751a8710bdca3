"""The shared outcome cases (testdata/outcomes/cases.json, see its README):
each case's steps replayed in order on one fresh policy through
``Policy.outcome`` (the module's ``outcome`` export), as every host
replays them."""
import json
import os
from pathlib import Path

import pytest

import backstop
from backstop import InputError, Outcome

from conftest import vector_input

CASES = Path(os.environ.get("BACKSTOP_OUTCOME_CASES",
                            Path(__file__).resolve().parents[3] / "testdata" / "outcomes" / "cases.json"))
FILE = json.loads(CASES.read_text())


def test_the_cases_are_of_this_abi():
    assert FILE["abi_version"] == backstop.ABI_VERSION
    assert FILE["open_poll_ms"] == backstop._host._contract.OPEN_POLL_MS


@pytest.mark.parametrize("case", FILE["cases"], ids=[c["name"] for c in FILE["cases"]])
def test_outcome_case(case):
    source = case["preset"] if case.get("preset") else json.dumps(case["policy"])
    with backstop.load_policy(source) as policy:
        assert policy.stateful == case.get("stateful", False)
        for i, step in enumerate(case["steps"]):
            where = "step %d (%s)" % (i, step["event"])
            # Absent numbers are 0 (the host's clock and draw are not in a case).
            kw = dict(deliveries=step.get("deliveries", 0), max_deliveries=step.get("max_deliveries", 0))
            failure = vector_input(step["failure"]) if "failure" in step else None
            if step["event"] != "failure":
                kw["now_ms"] = step.get("now_ms", 0)
            if "error" not in step:
                got = policy.outcome(step["event"], failure, **kw)
                assert isinstance(got, Outcome)
                assert got.to_dict() == step["expect"], where
                continue
            with pytest.raises(InputError) as e:
                policy.outcome(step["event"], failure, **kw)
            assert str(e.value) == step["error"], where
            # An invalid failure has the core's outcome (dead_letter malformed,
            # invalid); an invalid event has none.
            got = e.value.outcome.to_dict() if e.value.outcome is not None else None
            assert got == step.get("expect"), where


def test_an_unknown_event_is_refused_before_the_module():
    with backstop.load_policy("default") as policy:
        with pytest.raises(ValueError, match="outcome: event must be one of before, success, failure, delivered"):
            policy.outcome("finished")


def test_a_failure_the_host_refuses_has_the_invalid_outcome_too():
    # Refused in Python (a type), not by the module: the same outcome.
    with backstop.load_policy("default") as policy:
        with pytest.raises(InputError, match=r"attempt: must be an integer \(got 1\.5\)") as e:
            policy.outcome("failure", {"attempt": 1.5})
    assert e.value.outcome == Outcome(action="dead_letter", reason="malformed", klass="retryable", delay_ms=0, pause=False,
                                      count="dead_letter", invalid=True)


def test_an_unknown_field_or_not_a_mapping_has_the_invalid_outcome_too():
    with backstop.load_policy("default") as policy:
        for failure, message in (({"attempt": 1, "colour": "red"}, "colour: unknown field"),
                                 ([1], "failure: must be an object (got an array)")):
            with pytest.raises(InputError) as e:
                policy.outcome("failure", failure)
            assert str(e.value) == message and e.value.outcome.invalid and e.value.outcome.reason == "malformed"
            with pytest.raises(InputError) as e:  # another event: only the error
                policy.outcome("success", failure)
            assert str(e.value) == message and e.value.outcome is None
        with pytest.raises(InputError, match=r"^deliveries: must be an integer \(got a string\)$"):
            policy.outcome("delivered", {"attempt": 1}, deliveries="3")
