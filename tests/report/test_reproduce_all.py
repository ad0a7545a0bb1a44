"""`reproduce all`: every part runs once, finished parts are reused, a failing part is recorded."""

import json

import pytest
from typer.testing import CliRunner

from attnrank.cli import app
from attnrank.report import runner as rep
from attnrank.studies import registry
from attnrank.studies.registry import Claim, Entry, Result

CALLS: dict[str, int] = {}


def _ok(quick: bool = False) -> Result:
    CALLS["ok"] = CALLS.get("ok", 0) + 1
    return Result(claims=[Claim("ok.c", "test", "a claim", 2.0, 2.0, True),
                          Claim("ok.d", "test", "another", 1.0, 2.0, False)], params={"quick": quick})


def _boom(quick: bool = False) -> Result:
    CALLS["boom"] = CALLS.get("boom", 0) + 1
    raise RuntimeError("diverged at step 7")


@pytest.fixture
def probes(monkeypatch):
    CALLS.clear()
    monkeypatch.setattr(registry, "CATALOGUE", {})
    monkeypatch.setattr(registry, "_REGISTRY", {"ok": Entry("ok", "probe ok", "test", _ok),
                                           "boom": Entry("boom", "probe boom", "test", _boom)})


def test_resume_failure_and_profiles(tmp_path, probes):
    entries = rep.run_all(tmp_path, quick=True)
    assert [(e.name, e.cached, e.error is not None) for e in entries] == [("boom", False, True), ("ok", False, False)]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["claims_held"] == 1 and summary["claims_total"] == 2
    assert "diverged at step 7" in (tmp_path / "report.html").read_text()
    claims = json.loads((tmp_path / "claims.json").read_text())
    assert [c["reproduction"] for c in claims] == ["ok", "ok"]

    rep.run_all(tmp_path, quick=True)  # resumes: ok is cached, boom is retried
    assert CALLS == {"ok": 1, "boom": 2}
    rep.run_all(tmp_path, quick=False)  # another profile is not the same result
    assert CALLS["ok"] == 2
    rep.run_all(tmp_path, quick=False, force=True)
    assert CALLS["ok"] == 3


def test_cli_all_exit_codes(tmp_path, probes):
    runner = CliRunner()
    r = runner.invoke(app, ["reproduce", "all", "--quick", "--out", str(tmp_path), "--quiet"])
    assert r.exit_code == 3  # a reproduction raised
    r = runner.invoke(app, ["reproduce", "all", "--quick", "--full", "--out", str(tmp_path)])
    assert r.exit_code == 2
