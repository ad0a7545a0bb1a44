"""One contract for every verb's result (headrank.util.result): each verb is a function of
``headrank``; its result has ``table``, ``meta``, ``summary()``, ``save(out)``, ``load(out)``,
``plot()``, ``to_json()`` and ``_repr_html_``; ``load(save(out))`` gives the same result back;
``to_json()`` is what the CLI's ``--json`` prints for the same output directory."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

import headrank  # noqa: E402
from headrank.errors import HeadRankError  # noqa: E402

TINY = dict(n_pairs=3, n_keys=6, n_values=6, d_model=16, n_heads=2, batch_size=8)


def cli_json(*args: str) -> dict:
    """``headrank ARGS --json`` in this process: its stdout as JSON (``written`` left out)."""
    from typer.testing import CliRunner

    from headrank.cli import app

    r = CliRunner().invoke(app, [*args, "--json"])
    assert r.exit_code == 0, (r.output, repr(r.exception))
    payload = json.loads(r.stdout)
    if isinstance(payload, dict):
        payload.pop("written", None)
    return payload


def same(a, b, *paths: tuple[Path, Path]) -> None:
    """Equal as JSON text, where each ``(x, y)`` path pair names the same place."""
    ta, tb = json.dumps(a, sort_keys=True), json.dumps(b, sort_keys=True)
    for x, y in paths:
        ta, tb = ta.replace(str(x), "<out>"), tb.replace(str(y), "<out>")
    assert ta == tb


def check_contract(res, cls, tmp_path: Path, *paths: tuple[Path, Path], frames: bool = True) -> None:
    """Every method, and ``load(save(out))`` giving the same table, meta and JSON back."""
    assert isinstance(res, cls)
    assert isinstance(res.table, pd.DataFrame) and len(res.table)
    assert isinstance(res.meta, dict) and res.meta
    assert isinstance(res.summary(), pd.DataFrame) and len(res.summary())
    fig = res.plot()
    assert isinstance(fig, matplotlib.figure.Figure) and fig.axes
    plt.close(fig)
    json.dumps(res.to_json())  # JSON-able as it is
    html = res._repr_html_()
    assert html.startswith("<div>") and "<table" in html
    out = tmp_path / f"saved-{cls.__name__}"
    files = res.save(out)
    assert files and all(Path(f).is_file() for f in files)
    back = cls.load(out)
    same(res.to_json(), back.to_json(), *paths)
    if frames:  # missing values compare as missing, whether NaN or None
        norm = lambda t: t.astype(object).where(t.notna(), None)  # noqa: E731
        pd.testing.assert_frame_equal(norm(back.table), norm(res.table), check_dtype=False)
        pd.testing.assert_frame_equal(norm(back.summary()), norm(res.summary()), check_dtype=False)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny recall run (4 steps, a checkpoint every 2), through headrank.train."""
    d = tmp_path_factory.mktemp("contract") / "run"
    res = headrank.train("recall", d, steps=4, track_every=2, checkpoint_every=2, keep_checkpoints="all",
                         log="none", device="cpu", **TINY)
    return d, res


def test_train(run, tmp_path):
    d, res = run
    check_contract(res, headrank.RunResult, tmp_path, (d, tmp_path / "saved-RunResult"))
    assert res.summary()["step"].tolist() == [4] and "qk_effective_rank" in res.table
    same(headrank.RunResult.load(d).to_json(), res.to_json())


def test_spectra(run, tmp_path):
    d, _ = run
    res = headrank.spectra(d)
    check_contract(res, headrank.SpectraResult, tmp_path)
    head = res[0, 1, "ov"]
    assert head.S.shape == (8,) and head.U is None
    assert (head.S == res.sv["ov"][0, 1]).all()
    with pytest.raises(HeadRankError, match="was not analysed"):
        res[5, 0, "qk"]
    cli = cli_json("spectra", str(d), "--out", str(tmp_path / "cli"), "--no-plots")
    same(cli, headrank.SpectraResult.load(tmp_path / "cli").to_json())
    assert cli["overall"]["qk"]["effective_rank"] == pytest.approx(res.to_json()["overall"]["qk"]["effective_rank"])


def test_spectra_vectors_by_head(run):
    import numpy as np

    d, _ = run
    res = headrank.spectra(d, vectors=True, layers=[0])
    h = res[0, 1, "qk"]
    assert h.U.shape == h.V.shape == (16, 8) and np.allclose(h.Vh, h.V.T)
    assert np.allclose(h.S, res.sv["qk"][0, 1], rtol=1e-5)


def test_collapse(run, tmp_path):
    d, _ = run
    res = headrank.collapse(d, seqs=2, max_tokens=8)
    check_contract(res, headrank.CollapseResult, tmp_path)
    cli = cli_json("collapse", str(d), "--seqs", "2", "--max-tokens", "8", "--out", str(tmp_path / "cli"))
    same(cli, headrank.CollapseResult.load(tmp_path / "cli").to_json())


def test_scale(run, tmp_path):
    d, _ = run
    res = headrank.scale(d, scales="0.3,4.1")
    check_contract(res, headrank.ScaleResult, tmp_path)
    cli = cli_json("scale", str(d), "--scales", "0.3,4.1", "--out", str(tmp_path / "cli"))
    same(cli, headrank.ScaleResult.load(tmp_path / "cli").to_json())
    same(cli["counts"], res.to_json()["counts"])


def test_track(run, tmp_path):
    d, _ = run
    out = tmp_path / "series"
    res = headrank.track(d, out, workers=1)
    check_contract(res, headrank.SeriesResult, tmp_path, (out, tmp_path / "saved-SeriesResult"))
    out2 = tmp_path / "cli"
    cli = cli_json("track", str(d), "--out", str(out2), "--workers", "1")
    same(cli, headrank.SeriesResult.load(out2).to_json())
    same(cli["checkpoints"], res.to_json()["checkpoints"])


def test_compress(run, tmp_path):
    """compress keeps the contract once its result is an object (the factored-checkpoint rework);
    until then it returns compress.json's dict and this is skipped."""
    d, _ = run
    res = headrank.compress(d, tmp_path / "cut", rank=4)
    if not hasattr(res, "to_json"):
        pytest.skip("headrank.compress still returns a dict")
    check_contract(res, type(res), tmp_path, (tmp_path / "cut", tmp_path / f"saved-{type(res).__name__}"),
                   frames=False)
    cli = cli_json("compress", str(d), "--out", str(tmp_path / "cli"), "--rank", "4")
    same(cli, type(res).load(tmp_path / "cli").to_json())


def test_sweep(tmp_path):
    out = tmp_path / "sweep"
    res = headrank.sweep("recall", out, grid={"attn_weight_decay": [0.0, 0.5]},
                         set={"steps": 2, "track_every": 2, "checkpoint_every": 2, **TINY}, workers=1)
    check_contract(res, headrank.SweepResult, tmp_path, (out, tmp_path / "saved-SweepResult"))
    cli = cli_json("sweep", "recall", "--out", str(out), "--grid", "attn_weight_decay=0,0.5",
                   *[a for k, v in {"steps": 2, "track_every": 2, "checkpoint_every": 2, **TINY}.items()
                     for a in ("--set", f"{k}={v}")], "--workers", "1")
    same(cli, headrank.SweepResult.load(out).to_json())
    assert cli["counts"]["skipped"] == 2  # the same sweep again: both runs finished


@pytest.fixture
def probe(monkeypatch):
    from headrank.studies import registry
    from headrank.studies.registry import Claim, FigureOut, Study

    from .helpers import Profile

    def figures(data, params):
        fig, ax = plt.subplots()
        ax.plot([0, 1], [data["x"], data["x"]])
        return [FigureOut("probe", fig, "a line")]

    def claims(data, params):
        return [Claim("x is one", "tests", "x equals one", data["x"], 1.0, held=data["x"] == 1.0, key=f"x {data['x']}")]

    monkeypatch.setattr(registry, "CATALOGUE", {})
    monkeypatch.setattr(registry, "_REGISTRY", {})
    registry.register_study(Study("probe", "a probe", "tests", Profile, lambda p: {"x": 1.0}, claims, figures))


def test_reproduce(probe, tmp_path):
    out = tmp_path / "probe"
    res = headrank.reproduce("probe", out, profile="quick")
    check_contract(res, headrank.ReproduceResult, tmp_path, (out, tmp_path / "saved-ReproduceResult"))
    assert res.all_held and res.meta["profile"] == "quick"
    cli = cli_json("reproduce", "probe", "--out", str(tmp_path / "cli"), "--profile", "quick")
    same(cli, headrank.ReproduceResult.load(tmp_path / "cli").to_json())
    with pytest.raises(HeadRankError, match="unknown profile 'paper' for probe; use one of quick, full"):
        headrank.reproduce("probe", tmp_path / "p", profile="paper")


def test_every_verb_is_a_function_of_headrank():
    import inspect

    for verb in headrank.VERBS:
        fn = getattr(headrank, verb)
        assert callable(fn) and inspect.getdoc(fn), verb


def _cli_code(*args: str) -> int:
    from typer.testing import CliRunner

    from headrank.cli import app

    return CliRunner().invoke(app, list(args)).exit_code


def _api_ok(fn, *args, **kwargs) -> bool:
    try:
        fn(*args, **kwargs)
    except HeadRankError as e:
        assert "threads" in str(e) or "workers" in str(e)
        return False
    return True


def test_threads_one_bound_for_cli_and_api(run, tmp_path):
    """The same thread count is accepted or refused by the command and by the function."""
    from headrank.util.threads import max_threads

    d, _ = run
    for n in (0, 1, max_threads(), max_threads() + 1, 200):
        ok = 1 <= n <= max_threads()
        assert _api_ok(headrank.spectra, d, threads=n, layers=[0]) is ok, n
        assert (_cli_code("spectra", str(d), "--threads", str(n), "--layers", "0", "-q") == 0) is ok, n
    n = max_threads() + 1
    assert not _api_ok(headrank.collapse, d, threads=n)
    assert _cli_code("collapse", str(d), "--threads", str(n), "-q") == 2
    assert not _api_ok(headrank.scale, d, threads=n)
    assert _cli_code("scale", str(d), "--threads", str(n), "-q") == 2
    assert not _api_ok(headrank.track, d, tmp_path / "t", workers=n)
    assert _cli_code("track", str(d), "--out", str(tmp_path / "t"), "--workers", str(n), "-q") == 2
    assert not _api_ok(headrank.sweep, "recall", tmp_path / "s", workers=n)
    assert _cli_code("sweep", "recall", "--out", str(tmp_path / "s"), "--workers", str(n), "-q") == 2
    assert not _api_ok(headrank.train, "recall", tmp_path / "r", threads=n)
    assert _cli_code("train", "recall", "--out", str(tmp_path / "r"), "--threads", str(n), "-q") == 2
