"""Profiles a study adds beside quick and full (the ``paper`` profile): the runner records and reuses
them, ``reproduce all --profile`` runs only the studies that offer one, and the CLI refuses a
profile a study lacks or a clash with --quick/--full/--replot in one line."""

import json
from dataclasses import dataclass
from typing import ClassVar

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from headrank.cli import app  # noqa: E402
from headrank.report import runner as rep  # noqa: E402
from headrank.studies import registry  # noqa: E402
from headrank.studies.registry import Claim, FigureOut, Study  # noqa: E402

RUNS: list = []


@dataclass(frozen=True)
class Paper:
    n: int = 3
    profile: str = "full"
    PROFILES: ClassVar[tuple[str, ...]] = ("quick", "full", "paper")

    @classmethod
    def quick(cls):
        return cls(n=2, profile="quick")

    @classmethod
    def full(cls):
        return cls()

    @classmethod
    def paper(cls):
        return cls(n=7, profile="paper")


@dataclass(frozen=True)
class Plain:
    n: int = 3

    @classmethod
    def quick(cls):
        return cls(n=2)

    @classmethod
    def full(cls):
        return cls()


def _run(p) -> dict:
    RUNS.append(p)
    return {"y": [float(i) for i in range(p.n)]}


def _claims(data, p):
    return [Claim("probe.n", "test", "y has n points", len(data["y"]), p.n, held=len(data["y"]) == p.n)]


def _figures(data, p):
    fig, ax = plt.subplots()
    ax.plot(data["y"])
    return [FigureOut("probe", fig, "y")]


@pytest.fixture
def studies(monkeypatch):
    RUNS.clear()
    monkeypatch.setattr(registry, "CATALOGUE", {})
    monkeypatch.setattr(registry, "_REGISTRY", {})
    registry.register_study(Study("withpaper", "offers paper", "tests", Paper, _run, _claims, _figures))
    registry.register_study(Study("plain", "quick and full only", "tests", Plain, _run, _claims, _figures))


def test_run_records_the_profile_and_all_runs_only_the_studies_offering_it(tmp_path, studies):
    rep.run("withpaper", tmp_path / "one", profile="paper")
    meta = json.loads((tmp_path / "one" / "run.json").read_text())
    assert meta["profile"] == "paper" and meta["quick"] is False and meta["params"]["n"] == 7
    rep.run_all(tmp_path / "all", profile="paper")
    summary = json.loads((tmp_path / "all" / "summary.json").read_text())
    assert summary["profile"] == "paper" and [r["name"] for r in summary["reproductions"]] == ["withpaper"]
    assert "paper profile" in (tmp_path / "all" / "report.html").read_text()
    assert "paper profile" in (tmp_path / "one" / "report.html").read_text()
    assert [p.profile for p in RUNS] == ["paper", "paper"]
    entries = rep.run_all(tmp_path / "all", profile="paper")  # reused: same profile and params
    assert entries[0].cached and len(RUNS) == 2
    assert rep.staleness("withpaper", tmp_path / "all" / "withpaper", False)[1] == "another profile"  # full


def test_cli_profile(tmp_path, studies):
    r = CliRunner().invoke(app, ["reproduce", "withpaper", "--profile", "paper", "--out", str(tmp_path / "a"),
                                 "--quiet"])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "a" / "run.json").read_text())["profile"] == "paper"
    for args, words in ((["plain", "--profile", "paper"], "unknown profile 'paper' for plain"),
                        (["withpaper", "--profile", "paper", "--quick"], "exclude each other"),
                        (["withpaper", "--profile", "paper", "--replot"], "--replot keeps")):
        r = CliRunner().invoke(app, ["reproduce", *args, "--out", str(tmp_path / "b")])
        assert r.exit_code == 2 and words in r.output and "Traceback" not in r.output, r.output
    assert not (tmp_path / "b").exists()


def test_reproduce_all_takes_a_study_profile_from_the_cli(tmp_path, monkeypatch):
    """`headrank reproduce all --profile paper` (docs/paper_regime.md, make gallery-paper) runs the
    reproductions that offer it; a profile none offers is one line, exit 2."""
    from typer.testing import CliRunner

    from headrank.cli import app
    from headrank.report import runner as rep

    seen = {}
    monkeypatch.setattr(rep, "run_all", lambda out, **kw: seen.update(kw) or [])
    monkeypatch.setattr("headrank.report.result.ReproduceResult.load", lambda out: type("R", (), {
        "to_json": lambda self: {"reproductions": []}})())
    r = CliRunner().invoke(app, ["reproduce", "all", "--profile", "paper", "--out", str(tmp_path / "a"), "--json"])
    assert r.exit_code == 0, r.output
    assert seen["profile"] == "paper"
    monkeypatch.undo()
    r = CliRunner().invoke(app, ["reproduce", "all", "--profile", "nosuch", "--out", str(tmp_path / "b")])
    assert r.exit_code == 2 and "no reproduction offers the profile 'nosuch'" in r.output
