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
                             "untested": 0, "holm_family": 0, "holm_demoted": 0}
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


def _t(p_held):
    return {"verdict": "held" if p_held < 0.025 else "inconclusive", "p_held": p_held, "p_not_held": 1 - p_held, "n": 5}


def test_holm_demotes_a_held_statement_that_does_not_survive_the_family():
    # four held statements at one-sided p 0.001, 0.004, 0.01, 0.02: Holm at 0.025 keeps the first
    # (0.001 <= 0.00625) and the second (0.004 <= 0.0083), stops at 0.01 > 0.0125? no: 0.01 <= 0.0125 kept,
    # 0.02 <= 0.025 kept; with 0.02 -> 0.024 the last is still kept, with a fifth at 0.02 it is not
    ps = [0.001, 0.004, 0.012, 0.02, 0.02]
    claims = [_c(f"s{i}.x", held=True, tests=[_t(p)]).to_json() for i, p in enumerate(ps)]
    t = tally(claims)
    # m = 5: 0.001 <= 0.005, 0.004 <= 0.00625, 0.012 > 0.00833: stop; three demoted to inconclusive
    assert t["findings"] == {"held": 2, "not held": 0, "inconclusive": 3}
    assert t["holm_family"] == 5 and t["holm_demoted"] == 3


def test_a_claim_whose_tests_have_no_interval_is_untested_apart():
    one_seed = {"verdict": "untested", "p_held": None, "p_not_held": None, "n": 1}
    t = tally([_c("a.x", verdict="inconclusive", tests=[one_seed]).to_json(), _c("b.x", held=True).to_json()])
    assert t["untested"] == 1 and t["findings"]["held"] == 1 and t["holm_family"] == 0
