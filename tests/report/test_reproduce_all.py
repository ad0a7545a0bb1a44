"""`reproduce all`: every part runs once, finished parts are reused, a failing part is recorded."""

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from headrank.cli import app
from headrank.report import runner as rep
from headrank.studies import registry
from headrank.studies.registry import Claim, Entry
from tests.helpers import Profile

CALLS: dict[str, int] = {}




def _ok(p):
    CALLS["ok"] = CALLS.get("ok", 0) + 1
    return {"profile": p.profile}


def _boom(p):
    CALLS["boom"] = CALLS.get("boom", 0) + 1
    raise RuntimeError("diverged at step 7")


def _ok_claims(data, p):
    return [Claim("ok.c", "test", "a claim", 2.0, 2.0, True), Claim("ok.d", "test", "another", 1.0, 2.0, False)]


def _probe(name, run):
    return Entry(name, f"probe {name}", "test", registry.Study(name=name, title=f"probe {name}", source="test",
                                                              params=Profile, run=run, claims=_ok_claims,
                                                              figures=lambda d, p: []))


@pytest.fixture
def probes(monkeypatch):
    CALLS.clear()
    monkeypatch.setattr(registry, "CATALOGUE", {})
    monkeypatch.setattr(registry, "_REGISTRY", {"ok": _probe("ok", _ok), "boom": _probe("boom", _boom)})


def test_resume_failure_and_profiles(tmp_path, probes):
    entries = rep.run_all(tmp_path, quick=True)
    assert [(e.name, e.cached, e.error) for e in entries] == [("boom", False, "RuntimeError: diverged at step 7"),
                                                              ("ok", False, None)]
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


def test_a_part_that_cannot_be_replotted_is_recorded_and_the_others_replotted(tmp_path, probes, monkeypatch):
    """`reproduce all --replot`: one stored part whose figures raise (an older run's data) is
    recorded with its error, as a failing run is; the parts after it are still replotted."""
    rep.run_all(tmp_path, quick=True)
    (tmp_path / "boom").mkdir(exist_ok=True)
    for f in ("data.json", "run.json", "claims.json"):  # boom, stored as ok's run
        (tmp_path / "boom" / f).write_bytes((tmp_path / "ok" / f).read_bytes())
    real = rep.run

    def run(n, sub, **kw):
        if n == "boom":
            raise KeyError("log10_rel_mean")
        return real(n, sub, **kw)

    monkeypatch.setattr(rep, "run", run)
    entries = rep.run_all(tmp_path, replot=True)
    assert [(e.name, e.error) for e in entries] == [("boom", "KeyError: 'log10_rel_mean'"), ("ok", None)]
    assert "log10_rel_mean" in (tmp_path / "report.html").read_text()


# -- staleness: a finished part is reused only while its params, version and experiment source match


@dataclass(frozen=True)
class _P:
    n: int = 2

    @classmethod
    def quick(cls):
        return cls(n=STATE["n"])

    @classmethod
    def full(cls):
        return cls(n=5)


STATE: dict[str, object] = {}


def _run(p):
    STATE["runs"] = STATE.get("runs", 0) + 1
    return {"x": float(p.n)}


def _claims(data, p):
    return [Claim("st.x", "test", "x is positive", data["x"], "> 0", data["x"] > STATE["limit"], rule="x > limit")]


@pytest.fixture
def study(monkeypatch):
    STATE.clear()
    STATE.update(n=2, limit=0.0)
    s = registry.Study(name="st", title="staleness probe", source="test", params=_P, run=_run, claims=_claims,
                       figures=lambda d, p: [])
    monkeypatch.setattr(registry, "CATALOGUE", {})
    monkeypatch.setattr(registry, "_REGISTRY", {"st": Entry("st", "probe", "test", s)})


def test_a_reused_part_is_rejudged_and_a_stale_one_rerun(tmp_path, study, monkeypatch):
    rep.run_all(tmp_path, quick=True)
    assert STATE["runs"] == 1
    STATE["limit"] = 10.0  # the claim logic changed: re-judged from data.json, nothing re-run
    (e,) = rep.run_all(tmp_path, quick=True)
    assert STATE["runs"] == 1 and e.cached and e.claims[0]["verdict"] == "not held"
    assert rep.staleness("st", tmp_path / "st", True)[1] == ""
    STATE["n"] = 3  # the profile's params changed: re-run
    assert rep.staleness("st", tmp_path / "st", True)[1] == "params changed"
    rep.run_all(tmp_path, quick=True)
    assert STATE["runs"] == 2
    meta = json.loads((tmp_path / "st" / "run.json").read_text())
    meta["experiment_hash"] = "0" * 64  # as if the experiment's source had changed since
    (tmp_path / "st" / "run.json").write_text(json.dumps(meta))
    assert rep.staleness("st", tmp_path / "st", True)[1] == "experiment code changed"
    meta["versions"]["headrank"] = "0.0.0-old"
    (tmp_path / "st" / "run.json").write_text(json.dumps(meta))
    assert rep.staleness("st", tmp_path / "st", True)[1] == "package version changed"
    rep.run_all(tmp_path, quick=True)
    assert STATE["runs"] == 3


def test_the_experiment_hash_covers_the_code_that_makes_the_data(tmp_path, monkeypatch):
    import headrank

    pkg = Path(headrank.__file__).parent
    srcs = {f.relative_to(pkg).as_posix() for f in rep.experiment_sources("fig1")}
    # the study's run and params, and what trains, reads and measures: a change there makes a run stale
    assert {"studies/fig1/experiment.py", "studies/fig1/params.py", "studies/fig1/gd.py", "training/optim.py",
            "core/linalg.py", "io/checkpoint.py", "models/transformer.py", "analysis/scan.py"} <= srcs
    assert "studies/lm_common.py" in {f.relative_to(pkg).as_posix() for f in rep.experiment_sources("table1")}
    # claims, figures and the report are re-judged from data.json: not part of the hash
    assert not {"studies/fig1/claims.py", "studies/fig1/figures.py", "report/html.py"} & srcs
    f = tmp_path / "a.py"
    f.write_text("x = 1\n")
    monkeypatch.setattr(rep, "experiment_sources", lambda name: [f])
    h1 = rep.experiment_hash("fig1")
    f.write_text("x = 2\n")
    assert rep.experiment_hash("fig1") != h1
