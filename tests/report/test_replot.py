"""`--replot`: claims and figures re-made from a stored data.json, nothing re-run."""

import json
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from headrank.cli import app  # noqa: E402
from headrank.errors import HeadRankError  # noqa: E402
from headrank.report import runner as rep  # noqa: E402
from headrank.studies import registry  # noqa: E402
from headrank.studies.registry import Claim, FigureOut, Study  # noqa: E402

RUNS = []


@dataclass(frozen=True)
class P:
    n: int = 3
    lams: tuple[float, ...] = (0.0, 1.0)

    @classmethod
    def quick(cls):
        return cls(n=2)

    @classmethod
    def full(cls):
        return cls()


def _run(p: P) -> dict:
    RUNS.append(p)
    return {"y": [float(i) for i in range(p.n)], "bad": float("nan")}


def _claims(data, p: P):
    assert isinstance(p.lams, tuple) and data["bad"] is None  # what JSON gives back, on every path
    return [Claim("probe.n", "test", "y has n points", len(data["y"]), p.n, held=len(data["y"]) == p.n),
            Claim("probe.id", "test", "algebra", 0.0, 0.0, held=True, kind="identity")]


def _figures(data, p: P):
    fig, ax = plt.subplots()
    ax.plot(data["y"])
    return [FigureOut("probe", fig, "y")]


@pytest.fixture
def probe(monkeypatch):
    RUNS.clear()
    monkeypatch.setattr(registry, "CATALOGUE", {})
    monkeypatch.setattr(registry, "_REGISTRY", {})
    registry.register_study(Study("probe", "a probe", "tests", P, _run, _claims, _figures))


def test_replot_rejudges_without_running(tmp_path, probe):
    rep.run("probe", tmp_path, quick=True)
    assert len(RUNS) == 1
    data_before = (tmp_path / "data.json").read_bytes()
    claims_before = json.loads((tmp_path / "claims.json").read_text())
    (tmp_path / "probe.png").unlink()
    rep.run("probe", tmp_path, replot=True)
    assert len(RUNS) == 1  # nothing ran
    assert (tmp_path / "probe.png").exists() and (tmp_path / "data.json").read_bytes() == data_before
    assert json.loads((tmp_path / "claims.json").read_text()) == claims_before
    meta = json.loads((tmp_path / "run.json").read_text())
    assert meta["quick"] is True and meta["params"] == {"n": 2, "lams": [0.0, 1.0]}
    assert meta["tally"] == {"findings": {"held": 1, "not held": 0, "inconclusive": 0},
                             "identities": {"verified": 1, "failed": 0},
                             "checks": {"held": 0, "not held": 0, "inconclusive": 0}, "supporting": 0,
                             "untested": 0,
                             # probe.n carries no declared-margin test (no p): outside Holm's family
                             "holm_family": 0, "holm_demoted": 0}
    r = CliRunner().invoke(app, ["reproduce", "probe", "--replot", "--out", str(tmp_path)])
    assert r.exit_code == 0 and "run.json, 1 PNG)" in " ".join(r.output.split())  # figures it rewrote


def test_replot_judges_edited_data(tmp_path, probe):
    rep.run("probe", tmp_path, quick=True)
    d = json.loads((tmp_path / "data.json").read_text())
    d["y"] = d["y"][:1]
    (tmp_path / "data.json").write_text(json.dumps(d))
    rep.run("probe", tmp_path, replot=True)
    assert [c["held"] for c in json.loads((tmp_path / "claims.json").read_text())] == [False, True]


def test_replot_without_a_stored_run_is_a_user_error(tmp_path, probe):
    with pytest.raises(HeadRankError, match="`replot` needs run.json"):
        rep.run("probe", tmp_path, replot=True)
    r = CliRunner().invoke(app, ["reproduce", "probe", "--replot", "--out", str(tmp_path / "none")])
    assert r.exit_code == 2


def test_replot_all(tmp_path, probe):
    rep.run_all(tmp_path, quick=True)
    r = CliRunner().invoke(app, ["reproduce", "all", "--replot", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert len(RUNS) == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["quick"] is True and summary["tally"]["identities"]["verified"] == 1
    r = CliRunner().invoke(app, ["reproduce", "all", "--replot", "--quick", "--out", str(tmp_path)])
    assert r.exit_code == 2


def test_overrides_set_a_parameter_or_are_refused(tmp_path, probe):
    rep.run("probe", tmp_path / "a", quick=True, overrides={"n": 5})
    assert json.loads((tmp_path / "a" / "run.json").read_text())["params"]["n"] == 5
    with pytest.raises(HeadRankError, match="no parameter model"):
        rep.run("probe", tmp_path / "b", quick=True, overrides={"model": "x"})
    r = CliRunner().invoke(app, ["reproduce", "probe", "--model", "x", "--out", str(tmp_path / "c")])
    assert r.exit_code == 2 and "no parameter model" in r.stderr
