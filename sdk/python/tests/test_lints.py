"""A policy's lints (docs/policy.md, "Lints"): the module answers bits, the
schema's table spells them out, and load_policy warns with each."""

import json
import warnings
from pathlib import Path

import pytest

import backstop
from backstop import Lint, LintWarning


def test_jitter_none_warns_with_bp002():
    with pytest.warns(LintWarning) as caught:
        p = backstop.load_policy({"jitter": {"mode": "none"}})
    assert [(w.message.code, w.message.field) for w in caught] == [("BP002", "jitter.mode")]
    assert caught[0].filename == __file__  # the warning points at the caller's load_policy
    assert str(caught[0].message).startswith("jitter.mode: BP002: jitter none: ")
    assert [(lint.code, lint.field) for lint in p.lints] == [("BP002", "jitter.mode")]
    assert isinstance(p.lints[0], Lint) and "backoff without jitter" in p.lints[0].message
    p.close()


def test_an_ignored_lint_is_silent():
    with warnings.catch_warnings():
        warnings.simplefilter("error", LintWarning)
        p = backstop.load_policy({"jitter": {"mode": "none"}, "lint_ignore": {"BP002": "a test of the herd"}})
        batch = backstop.load_policy("batch")
    assert p.lints == () and batch.lints == ()
    p.close()
    batch.close()


def test_several_lints_in_code_order():
    with pytest.warns(LintWarning):
        p = backstop.load_policy({"max_attempts": 30, "backoff": {"strategy": "none"}})
    assert [lint.code for lint in p.lints] == ["BP001", "BP003"]
    p.close()


def test_the_shared_lint_cases():
    """Every policy of testdata/lints/cases.json reports exactly its lints."""
    cases = json.loads((Path(__file__).resolve().parents[3] / "testdata" / "lints" / "cases.json").read_text())["cases"]
    assert cases
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LintWarning)
        for c in cases:
            p = backstop.load_policy(c["policy"])
            assert [lint._asdict() for lint in p.lints] == c["lints"], c["name"]
            p.close()
