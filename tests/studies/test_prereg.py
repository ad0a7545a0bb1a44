"""Pre-registration you can check: each claim's rule hash, and docs/preregistration.json against the code."""

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from headrank.studies import prereg
from headrank.studies.fig2 import claims as fig2_claims
from headrank.studies.fig2.params import Fig2Params
from tests.studies import test_fig2

ROOT = Path(__file__).resolve().parents[2]
RECORD = json.loads((ROOT / "docs" / "preregistration.json").read_text())


def _claim(name="fig2.balance_time_constant"):
    return next(c for c in fig2_claims.claims(test_fig2.GOOD, test_fig2.P) if c.name == name)


def test_a_claim_knows_the_function_that_judged_it():
    assert _claim().judged_by == "headrank.studies.fig2.claims:balance_time_constant"
    assert _claim("fig2.balance_lasts").judged_by == "headrank.studies.fig2.horizon:balance_lasts"


def test_the_hash_reads_thresholds_and_code_not_data():
    c, p = _claim(), Fig2Params.quick()
    h = prereg.rule_sha256(c.name, c.judged_by, p)
    assert h == prereg.rule_sha256(c.name, c.judged_by, replace(p, workers=7))  # operational: no change
    assert h != prereg.rule_sha256(c.name, c.judged_by, replace(p, vanish_ratio=0.2))  # a threshold
    assert h != prereg.rule_sha256(c.name, "headrank.studies.fig2.claims:gap_vanishes", p)  # another rule's code
    bad = next(c for c in fig2_claims.claims(test_fig2.BAD, test_fig2.P) if c.name == "fig2.balance_time_constant")
    assert prereg.rule_sha256(bad.name, bad.judged_by, p) == h  # other data, same rule


def test_static_digest_ignores_layout_and_follows_called_functions_and_constants():
    src = "K = 1\nJ = 5\ndef f(x):\n    return g(x) + K  # c\ndef g(x):\n    return x\ndef h():\n    return J\n"
    moved = "J = 5\nK = 1\n\n\ndef g(x):\n    return x\ndef f(x):\n    return g(x) + K\ndef h():\n    return 9\n"
    assert prereg.static_digest(src, ["f"]) == prereg.static_digest(moved, ["f"])  # h and J are not read by f
    assert prereg.static_digest(src, ["f"]) != prereg.static_digest(src.replace("K = 1", "K = 2"), ["f"])
    assert prereg.static_digest(src, ["f"]) != prereg.static_digest(src.replace("return x", "return -x"), ["f"])
    assert prereg.static_digest(src, ["missing"]) is None


def test_the_record_matches_the_code():
    """Every hash in docs/preregistration.json is what the code gives for that claim and profile
    (regenerate with `python docs/preregistration.py` after changing a rule)."""
    from headrank.studies.registry import get

    stale = []
    for name, row in RECORD["claims"].items():
        study = get(name.split(".")[0] if not name.startswith("prop31.") else "fig1").study
        for profile, h in row["rule_sha256"].items():
            if prereg.rule_sha256(name, row["judged_by"], getattr(study.params, profile)()) != h:
                stale.append(f"{name} ({profile})")
    assert stale == [], "docs/preregistration.json is stale for: " + ", ".join(stale)


def test_every_claim_is_in_the_record_with_its_judging_function():
    from tests.studies import test_coverage

    for c in test_coverage._all_claims():
        assert c.name in RECORD["claims"], c.name
        assert RECORD["claims"][c.name]["judged_by"] == c.judged_by, c.name


def test_every_first_fixed_commit_is_in_the_history():
    try:
        subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    commits = {row["first_fixed"] for row in RECORD["claims"].values()}
    commits |= {c for runs in RECORD["stored_runs"].values() for c, *_ in runs.values() if c != "?"}
    commits |= {c for runs in RECORD["same_seed_data"].values() for c in runs.values()}
    for c in commits:
        assert subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{c}^{{commit}}"]).returncode == 0, c


def test_a_rejudged_claim_is_marked_when_its_rule_changed_after_the_run():
    from headrank.report.runner import _mark_rule_changes

    fresh = [{"name": "a", "rule_sha256": "h1"}, {"name": "b", "rule_sha256": "h2"}]
    _mark_rule_changes(fresh, None)
    assert [c["rule_changed_after_run"] for c in fresh] == [False, False]
    rejudged = [{"name": "a", "rule_sha256": "h1"}, {"name": "b", "rule_sha256": "h3"}, {"name": "c", "rule_sha256": "x"}]
    _mark_rule_changes(rejudged, fresh)
    assert [c["rule_changed_after_run"] for c in rejudged] == [False, True, None]  # c: no hash at the run
    again = [{"name": "b", "rule_sha256": "h3"}]
    _mark_rule_changes(again, rejudged)  # a second re-judging still compares with the run's own rule
    assert again[0]["rule_changed_after_run"] is True and again[0]["rule_sha256_at_run"] == "h2"
