"""testdata/vectors/one_call.json: the one-call methods on a stateless
policy, where the host answers without the module, raise in the same
precedence as Node's and Java's: a wrong type, then a closed policy, then
the module's refusal of a negative argument."""

import json
from pathlib import Path

import pytest

import backstop
from backstop import BackstopError, InputError

FILE = json.loads((Path(__file__).resolve().parents[3] / "testdata" / "vectors" / "one_call.json").read_text())


@pytest.mark.parametrize("case", FILE["cases"], ids=lambda c: "%s(%r)%s" % (c["method"], c["arg"], " closed" if c.get("closed") else ""))
def test_one_call(case):
    p = backstop.load_policy(FILE["policy"])
    assert not p.stateful
    if case.get("closed"):
        p.close()
    call = getattr(p, case["method"])
    if case.get("error") == "input":
        with pytest.raises(InputError) as e:
            call(case["arg"])
        assert str(e.value) == case["message"]
    elif case.get("error") == "closed":
        with pytest.raises(BackstopError, match="the policy is closed"):
            call(case["arg"])
    else:
        assert call(case["arg"]) == case["answer"]
