"""Claims carry a kind and a three-way verdict; the tally counts them apart."""

import pytest

from headrank.studies.registry import Claim, tally


def _c(name="x", **kw):
    return Claim(name=name, source="s", statement="t", measured=1, expected=1, **kw)


def test_two_way_claims_still_work():
    assert _c(held=True).verdict == "held" and _c(held=False).verdict == "not held"
    assert _c(held=True).kind == "finding"


def test_inconclusive_is_not_held_and_keeps_its_reason():
    c = _c(verdict="inconclusive", reason="exposure 0.3 < 3")
    assert c.held is False and c.to_json()["reason"] == "exposure 0.3 < 3"


@pytest.mark.parametrize("kw", [dict(), dict(held=True, verdict="not held"), dict(verdict="maybe"),
                                dict(held=True, kind="lemma"), dict(verdict="inconclusive", kind="identity")])
def test_bad_claims_are_refused(kw):
    with pytest.raises(ValueError):
        _c(**kw)


def test_tally_separates_findings_and_identities():
    claims = [_c("a", held=True).to_json(), _c("b", held=False).to_json(), _c("c", verdict="inconclusive").to_json(),
              _c(held=True, kind="identity").to_json(), _c(held=False, kind="identity").to_json(),
              {"held": True}]  # an older claims.json entry: a two-way finding
    assert tally(claims) == {"findings": {"held": 2, "not held": 1, "inconclusive": 1},
                             "identities": {"verified": 1, "failed": 1},
                             "checks": {"held": 0, "not held": 0, "inconclusive": 0}, "supporting": 0,
                             "untested": 0}
    assert tally([_c(held=True).to_json(), _c(held=False).to_json()])["findings"]["not held"] == 1  # one name: one


def test_checks_are_tallied_apart_and_supporting_claims_count_once():
    claims = [_c(held=True).to_json(), _c(held=True, kind="check").to_json(),
              _c(verdict="inconclusive", kind="check").to_json(),
              _c(held=False, supports="x").to_json()]  # re-tests x's comparison: evidence, not a finding
    t = tally(claims)
    assert t["findings"] == {"held": 1, "not held": 0, "inconclusive": 0}
    assert t["checks"] == {"held": 1, "not held": 0, "inconclusive": 1}
    assert t["supporting"] == 1
    assert _c(held=True, kind="check").kind == "check"
