"""spectra's tables without pandas (analysis.columns): every byte and every mean against pandas'
own ``to_csv`` and ``groupby``, the reference the files were written with before."""

import io
import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from headrank.analysis import columns as C
from headrank.analysis.scan import SpectraResult, analyze
from headrank.core.baseline import BASELINE_COLUMNS
from headrank.core.metrics import METRICS, SUMMARY_METRICS

from .test_spectra_routes import _write_llama


def _random_columns(rng, n):
    x = rng.standard_normal(n) * 10.0 ** rng.integers(-300, 300, n)
    x[rng.random(n) < 0.1] = np.nan
    x[rng.random(n) < 0.03] = -0.0
    x[rng.random(n) < 0.03] = np.inf
    y = rng.random(n)
    y[rng.random(n) < 0.05] = -np.inf
    words = np.array(["qk", "ov", "a,b", 'say "hi"', "line\nbreak", "", " lead", "tr\u00e9s"])
    return {"layer": rng.integers(0, 4, n), "product": rng.choice(words[:2], n), "head": rng.integers(0, 9, n),
            "x": x, "y": y, "r": rng.integers(-1, 200, n).astype(np.int64), "ok": rng.random(n) < 0.5,
            "whole": np.floor(rng.random(n) * 100), "s": rng.choice(words, n)}


def _bits(a):
    return np.asarray(a, dtype=np.float64).view(np.int64)


def test_csv_is_byte_for_byte_what_pandas_writes():
    rng = np.random.default_rng(0)
    for n in (1, 2, 17, 300):
        cols = _random_columns(rng, n)
        mine, theirs = io.StringIO(), io.StringIO()
        C.write_csv(mine, cols)
        pd.DataFrame(cols).to_csv(theirs, index=False)
        assert mine.getvalue() == theirs.getvalue()


def test_group_means_and_sums_are_pandas_bit_for_bit():
    """pandas sums each group with compensated (Kahan) summation in row order; the same here,
    checked on values spread over 600 decades, NaN, ±Inf and rows of each group interleaved."""
    rng = np.random.default_rng(1)
    for n in (1, 5, 64, 999):
        cols = _random_columns(rng, n)
        mine = C.group_agg(cols, ("layer", "product"), [("heads", "head", "size"), ("x", "x", "mean"),
                                                        ("y", "y", "mean"), ("r", "r", "mean"), ("ys", "y", "sum"),
                                                        ("xs", "x", "sum")])
        theirs = pd.DataFrame(cols).groupby(["layer", "product"], sort=True).agg(
            heads=("head", "size"), x=("x", "mean"), y=("y", "mean"), r=("r", "mean"), ys=("y", "sum"),
            xs=("x", "sum")).reset_index()
        assert list(mine) == list(theirs.columns)
        for k in ("layer", "heads"):
            assert np.array_equal(mine[k], theirs[k].to_numpy())
        assert list(mine["product"]) == list(theirs["product"])
        for k in ("x", "y", "r", "ys", "xs"):
            assert np.array_equal(_bits(mine[k]), _bits(theirs[k])), k
        assert _bits(C.series_mean(cols["x"])) == _bits(pd.Series(cols["x"]).mean())


def test_frames_concatenate_as_pandas_concatenates():
    a = {"layer": 0, "head": np.arange(3), "part": "band", "e": np.ones(3)}
    b = {"layer": 1, "head": np.arange(2), "part": "pass", "e": np.zeros(2), "rank": np.array([4, 5])}
    mine = C.to_frame(C.concat([a, b]))
    theirs = pd.concat([pd.DataFrame(a), pd.DataFrame(b)], ignore_index=True)
    pd.testing.assert_frame_equal(mine, theirs)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama") / "m"
    _write_llama(path, n_layers=3)
    return path


def test_saved_tables_are_what_pandas_wrote_before(llama, tmp_path):
    """heads.csv, summary.csv and rotary.csv of a rotary checkpoint, and meta.json's rotary
    means, against the pandas code that wrote them until now (reproduced here)."""
    res = analyze(llama, threads=1)
    res.save(tmp_path / "o", plots=False)
    t = res.table
    heads = t.assign(source=str(res.meta["source"])).to_csv(index=False)
    assert (tmp_path / "o" / "heads.csv").read_text() == heads
    s = t.assign(rank_frac=t["rank"] / t["head_dim"]).groupby(["layer", "product"], sort=True).agg(
        heads=("head", "size"), rank_frac=("rank_frac", "mean"),
        **{k: (k, "mean") for k in (*SUMMARY_METRICS, *BASELINE_COLUMNS)})  # the random baseline beside the means
    assert (tmp_path / "o" / "summary.csv").read_text() == s.reset_index().to_csv(index=False)
    pd.testing.assert_frame_equal(res.summary(), s.reset_index())
    rot = res.rotary
    assert (tmp_path / "o" / "rotary.csv").read_text() == rot.to_csv(index=False)
    bands = rot[rot["part"] == "band"]
    meta = json.loads((tmp_path / "o" / "meta.json").read_text())["conventions"]["rotary_bands"]
    assert meta["mean_rotary_share"] == float(bands.groupby(["layer", "head"])["share"].sum().mean())
    # the DataFrame is the one pandas built from the layer frames before: dtypes included
    assert {str(t[m.name].dtype) for m in METRICS if m.integer} == {"int64"}  # rank, k90, k99, k999 ...
    assert t["finite"].dtype == bool and t["layer"].dtype == np.int64
    again = SpectraResult.load(tmp_path / "o")
    pd.testing.assert_frame_equal(again.summary(), res.summary(), check_exact=True)


def test_a_nonfinite_head_keeps_its_counts_as_nan(llama, tmp_path):
    from safetensors.torch import load_file, save_file

    sd = load_file(llama / "model.safetensors")
    sd["model.layers.1.self_attn.q_proj.weight"][3, 5] = float("nan")
    bad = tmp_path / "bad"
    bad.mkdir()
    save_file(sd, bad / "model.safetensors", metadata={"format": "pt"})
    (bad / "config.json").write_text((llama / "config.json").read_text())
    res = analyze(bad, threads=1)
    assert res.meta["nonfinite_heads"] == [{"layer": 1, "head": 0, "product": "qk"}]
    assert str(res.table["rank"].dtype) == "float64" and res.table["rank"].isna().sum() == 1
    res.save(tmp_path / "o", plots=False)
    assert (tmp_path / "o" / "heads.csv").read_text() == res.table.assign(
        source=str(res.meta["source"])).to_csv(index=False)
    assert torch.isnan(torch.tensor(res.sv["qk"][1, 0])).all()


def test_spectra_with_its_files_imports_neither_pandas_nor_torch(llama, tmp_path):
    code = ("import sys; from headrank.analysis.scan import analyze; "
            f"r = analyze({str(llama)!r}, device='cpu'); r.save({str(tmp_path / 'out')!r}, plots=False); "
            "print(sorted(m for m in ('pandas', 'torch', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
    assert {p.name for p in (tmp_path / "out").iterdir()} >= {"heads.csv", "summary.csv", "rotary.csv", "meta.json"}


def test_a_table_edited_as_a_dataframe_is_saved_as_pandas_would(llama, tmp_path):
    """Once ``result.table`` is a DataFrame, ``save`` writes what it holds now (an added text
    column with a missing value, a nullable integer column), as ``to_csv`` does."""
    res = analyze(llama, threads=1, rotary=False)
    res.table["note"] = ["x, y" if i % 3 else None for i in range(len(res.table))]
    res.table["maybe"] = pd.array([i if i % 2 else None for i in range(len(res.table))], dtype="Int64")
    res.save(tmp_path / "o", plots=False)
    want = res.table.assign(source=str(res.meta["source"])).to_csv(index=False)
    assert (tmp_path / "o" / "heads.csv").read_text() == want
