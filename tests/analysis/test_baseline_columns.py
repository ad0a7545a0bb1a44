"""The random baseline beside every rank, end to end: heads.csv's baseline columns against the
test's own dense Monte Carlo (tests/core/test_baseline.py), summary() and repr showing measured
against baseline, and the figures drawing it (read back from the drawn figures)."""

import csv
import subprocess
import sys

import numpy as np
import torch
import transformers as tf

from tests.core.test_baseline import _dense_monte_carlo
from tests.figcheck import data_lines, xy

D, H = 32, 4  # head dim 8


def _llama(path):
    torch.manual_seed(0)
    tf.LlamaForCausalLM(tf.LlamaConfig(hidden_size=D, num_hidden_layers=2, num_attention_heads=H,
                                       num_key_value_heads=2, intermediate_size=48, vocab_size=61,
                                       bos_token_id=0, eos_token_id=0, pad_token_id=0)).save_pretrained(path)


def test_heads_csv_baseline_columns_match_an_independent_monte_carlo(tmp_path):
    _llama(tmp_path / "m")
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "headrank", "spectra", str(tmp_path / "m"), "--out", str(out), "-q"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(open(out / "heads.csv")))
    assert len(rows) == 2 * H * 2
    ref = _dense_monte_carlo(D, D, D // H, 1e-3, n=3000)
    for col, (mean, se) in ref.items():
        got = {float(row[col]) for row in rows}
        assert len(got) == 1, col  # every head of these shapes has the same baseline
        (value,) = got
        assert abs(value - mean) <= 5 * se * np.sqrt(1 + 3000 / 256) + 1e-12, (col, value, mean, se)
    summary = list(csv.DictReader(open(out / "summary.csv")))
    assert all("effective_rank_random" in s and "stable_rank_random" in s for s in summary)


def test_summary_repr_and_figures_show_the_baseline(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from headrank.analysis import plots
    from headrank.analysis.figproc import figure_data
    from headrank.analysis.scan import analyze

    _llama(tmp_path / "m")
    res = analyze(tmp_path / "m")
    s = res.summary()
    assert {"effective_rank", "effective_rank_random", "stable_rank", "stable_rank_random", "rank_random"} <= set(s)
    text = repr(res)
    assert len(text) < 1000 and text.count("\n") <= 6 and "random" in text
    # singular_values.png: the random product's mean σ_i/σ_1, against the test's own Monte Carlo
    data = figure_data(res)
    fig = plots.sv_curves(data)
    for ax in fig.axes[:2]:
        (line,) = [ln for ln in data_lines(ax) if ln.get_label() == "random product"]
        x, y = xy(line)
        rng = np.random.default_rng(7)
        draws = []
        for _ in range(2000):
            sv = np.linalg.svd(rng.normal(size=(D, D // H)) @ rng.normal(size=(D, D // H)).T, compute_uv=False)[:D // H]
            draws.append(sv / sv[0])
        draws = np.array(draws)
        se = draws.std(0, ddof=1) / np.sqrt(2000) * np.sqrt(1 + 2000 / 256)
        assert np.array_equal(x, np.arange(1, D // H + 1)) and np.all(np.abs(y - draws.mean(0)) <= 5 * se + 1e-12)
    # res.plot(): a dotted random-product line per product beside the effective rank
    fig = res.plot()
    labels = [ln.get_label() for ln in data_lines(fig.axes[0])]
    assert "QK random product" in labels and "OV random product" in labels
    (qk,) = [ln for ln in data_lines(fig.axes[0]) if ln.get_label() == "QK random product"]
    assert np.allclose(xy(qk)[1], res.table.groupby("layer")["effective_rank_random"].mean().to_numpy())


def test_minilm_repr_is_short():
    import headrank

    res = headrank.spectra("minilm")
    assert len(repr(res)) < 1000 and "SpectraResult of minilm" in repr(res)
    assert res[-1, -1, "QK"].S.tolist() == res[5, 11, "qk"].S.tolist()
