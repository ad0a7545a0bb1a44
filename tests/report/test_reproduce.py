"""The reproduction framework and `headrank reproduce`: registry, files written, exit codes."""

import base64
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from headrank.cli import app  # noqa: E402
from headrank.errors import HeadRankError  # noqa: E402
from headrank.report import runner as rep
from headrank.studies import registry
from headrank.util.fileio import jsonable

CLAIM_KEYS = {"name", "source", "statement", "measured", "expected", "held"}


def _fig():
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    return fig


@dataclass(frozen=True)
class _Params:
    profile: str = "full"
    n: int = 3

    @classmethod
    def quick(cls):
        return cls(profile="quick")

    @classmethod
    def full(cls):
        return cls()


def _mixed_claims(data, p):
    return [
        registry.Claim(name="t.ok", source="here", statement="1 + 1 = 2", measured=2.0, expected=2.0, held=True,
                       tolerance=0.0),
        registry.Claim(name="t.bad", source="here", statement="pi = 3", measured=math.pi, expected=3.0,
                       held=np.bool_(False), tolerance=1e-3, detail="<b>escaped</b>"),
    ]


registry.register_study(registry.Study(
    name="_test_mixed", title="test: one claim holds, one does not", source="tests", params=_Params,
    run=lambda p: {"series": np.arange(3.0), "nan": float("nan"), "nested": {"x": np.float32(1.5)}},
    claims=_mixed_claims, figures=lambda d, p: [registry.FigureOut("panel", _fig(), "a line")],
    notes=lambda d, p: ["a note"]))
registry.register_study(registry.Study(
    name="_test_allheld", title="test: every claim holds", source="tests", params=_Params, run=lambda p: {},
    claims=lambda d, p: [registry.Claim(name="t.ok", source="here", statement="s", measured=1, expected=1, held=True)],
    figures=lambda d, p: []))


def test_catalogue_lists_known_reproductions_without_importing_them():
    code = ("import sys; from headrank.studies import registry as r; names = [n for n, _ in r.listing()]; "
            "assert {'fig1', 'fig5', 'fig2', 'fig3', 'fig4', 'table1', 'collapse', 'scale'} <= set(names), names; "
            "loaded = [m for m, _ in r.CATALOGUE.values() if m in sys.modules]; assert not loaded, loaded; "
            "r.get('fig1'); assert r.CATALOGUE['fig1'][0] in sys.modules; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_unknown_name_is_a_user_error():
    with pytest.raises(HeadRankError, match="unknown reproduction 'nope'"):
        registry.get("nope")


def test_register_twice_from_another_module_is_refused():
    def run(p):
        return {}

    run.__module__ = "somewhere.else"
    with pytest.raises(ValueError, match="registered twice"):
        registry.register_study(registry.Study(name="_test_mixed", title="x", source="y", params=_Params, run=run,
                                               claims=lambda d, p: [], figures=lambda d, p: []))


def test_jsonable():
    out = jsonable({"a": np.array([1.0, np.inf]), "b": (np.int64(2), np.bool_(True)), "c": float("nan")})
    assert out == {"a": [1.0, None], "b": [2, True], "c": None}
    json.dumps(out, allow_nan=False)


def test_run_writes_report_claims_data(tmp_path):
    s = rep.run("_test_mixed", tmp_path / "o", quick=True)
    assert not s.all_held and s.n_held == 1
    out = tmp_path / "o"
    claims = json.loads((out / "claims.json").read_text())
    assert [c["name"] for c in claims] == ["t.ok", "t.bad"]
    assert all(CLAIM_KEYS <= set(c) for c in claims)
    assert claims[1]["held"] is False and claims[1]["measured"] == pytest.approx(math.pi)
    data = json.loads((out / "data.json").read_text())
    assert data == {"series": [0.0, 1.0, 2.0], "nan": None, "nested": {"x": 1.5}}
    meta = json.loads((out / "run.json").read_text())
    assert meta["params"] == {"profile": "quick", "n": 3} and meta["claims_held"] == 1 and meta["runtime_s"] >= 0
    assert {"numpy", "scipy", "torch", "matplotlib", "python", "headrank"} <= set(meta["versions"])
    html = (out / "report.html").read_text()
    assert html.index("findings held") < html.index("<figure") < html.index("<h3>Findings") < \
        html.index("<summary>parameters") < html.index("<summary>library versions")
    assert "badge not-held" in html and "&lt;b&gt;escaped&lt;/b&gt;" in html and "<b>escaped</b>" not in html
    b64 = html.split("data:image/png;base64,")[1].split("'")[0]
    assert base64.b64decode(b64)[:8] == b"\x89PNG\r\n\x1a\n"
    assert "http://" not in html and "https://" not in html  # self-contained
    assert (out / "panel.png").read_bytes()[:4] == b"\x89PNG"
    assert not [p for p in out.iterdir() if p.name.startswith(".") and p.name != ".headrank-output.json"]  # no temp files left


def test_run_refuses_a_file_as_out(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(HeadRankError, match="not a directory"):
        rep.run("_test_allheld", f)


# --------------------------------------------------------------------------- CLI

runner = CliRunner()


def test_cli_list():
    r = runner.invoke(app, ["reproduce", "--list"])
    assert r.exit_code == 0, r.output
    assert "fig1" in r.stdout and "fig5" in r.stdout
    r = runner.invoke(app, ["reproduce", "--list", "--json"])
    assert {"fig1", "fig5"} <= {row["name"] for row in json.loads(r.stdout)}


def test_cli_exit_codes_strict(tmp_path):
    r = runner.invoke(app, ["reproduce", "_test_mixed", "--out", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output  # a claim that did not hold is a finding
    assert "findings: 1 held, 1 not held, 0 inconclusive" in " ".join(r.stdout.split())
    r = runner.invoke(app, ["reproduce", "_test_mixed", "--out", str(tmp_path / "b"), "--strict"])
    assert r.exit_code == 1
    assert (tmp_path / "b" / "claims.json").exists()  # still written
    r = runner.invoke(app, ["reproduce", "_test_allheld", "--out", str(tmp_path / "c"), "--strict", "--quiet"])
    assert r.exit_code == 0 and r.stdout == ""
    r = runner.invoke(app, ["reproduce", "_test_mixed", "--out", str(tmp_path / "d"), "--json"])
    assert [c["held"] for c in json.loads(r.stdout)["claims"]] == [True, False]


def test_cli_missing_name_is_exit_2():
    r = runner.invoke(app, ["reproduce"])
    assert r.exit_code == 2
    assert "NAME, 'all', or --list" in r.stderr


def _headrank(*args, cwd=None):
    env = dict(os.environ, COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "headrank", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


def test_cli_unknown_name_one_line_exit_2(tmp_path):
    r = _headrank("reproduce", "nope", "--out", str(tmp_path / "x"))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown reproduction 'nope'" in lines[0] and "fig1" in lines[0]
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_cli_fig1_quick_end_to_end(tmp_path):
    """The real fig1 reproduction through the installed command: files, claims and their numbers."""
    out = tmp_path / "fig1"
    r = _headrank("reproduce", "fig1", "--out", str(out), "--quick")
    assert r.returncode == 0, r.stderr
    claims = {c["name"]: c for c in json.loads((out / "claims.json").read_text())}
    assert {"fig1.gap_decay", "fig1.balance_rate", "fig1.gd_recursion", "fig1.soft_threshold",
            "fig1.threshold_algebraic", "prop31.balanced_equality", "prop31.unbalanced_gap"} <= set(claims)
    assert claims["fig1.soft_threshold"]["held"] and claims["fig1.soft_threshold"]["measured"] < 1e-4
    assert claims["fig1.gd_recursion"]["measured"] < 1e-12
    assert claims["prop31.balanced_equality"]["measured"] < 1e-12
    assert claims["fig1.threshold_algebraic"]["measured"] == pytest.approx(0.4, rel=0.01)
    data = json.loads((out / "data.json").read_text())
    assert np.asarray(data["gap"]).shape == (6, 1001)
    np.testing.assert_allclose(data["sv_final"], data["sv_closed_form"], atol=3e-3)  # threshold entry included
    assert (out / "fig1.png").stat().st_size > 20_000 and (out / "report.html").exists()
