"""``spectra --energy``: one ``k…`` column per energy level, each the fewest singular values holding
that share of Σσ², checked against a direct count from numpy's SVD of the formed products; k999
is in the table by default; a bad level is one line before anything is read."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from headrank.analysis.scan import analyze
from headrank.core.metrics import energy_levels, energy_name
from headrank.errors import HeadRankError


def _k(s, level):
    e = np.cumsum(s**2)
    return int(np.searchsorted(e, level * e[-1] * (1 - 1e-12)) + 1)


def test_names_and_parsing():
    assert [energy_name(v) for v in (0.9, 0.99, 0.999, 0.95, 0.5, 1.0, 0.9999)] == \
        ["k90", "k99", "k999", "k95", "k50", "k100", "k9999"]
    assert energy_levels("0.9, 0.99,0.999") == (0.9, 0.99, 0.999)
    for bad in ("0", "1.5", "abc", "0.9,0.9", "", "0.1234567"):
        with pytest.raises(ValueError):
            energy_levels(bad)


def test_energy_columns_equal_a_direct_count(minilm_dir):
    res = analyze(minilm_dir, layers="0,5", energy="0.5,0.9,0.95,0.999")
    t = res.table
    assert {"k90", "k99", "k999", "k50", "k95"} <= set(t.columns)
    for _, row in t.iterrows():
        s = res.sv[row["product"]][[0, 5].index(row["layer"]), row["head"]]
        for v in (0.5, 0.9, 0.95, 0.99, 0.999):
            assert row[energy_name(v)] == _k(s, v), (row["layer"], row["head"], v)
    assert res.meta["conventions"]["k95"].startswith("energy rank: fewest sigma_i holding 95%")
    assert "k50" not in analyze(minilm_dir, layers="0").table.columns  # default: the table's own levels


def test_cli_energy_column_and_bad_level(tmp_path):
    r = subprocess.run([sys.executable, "-m", "headrank", "spectra", "minilm", "--layers", "1", "--energy",
                        "0.8,0.999", "--no-plots", "--out", "o"], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    heads = pd.read_csv(tmp_path / "o" / "heads.csv")
    assert "k80" in heads and heads["k80"].dtype == np.int64 and (heads["k80"] <= heads["k999"]).all()
    r = subprocess.run([sys.executable, "-m", "headrank", "spectra", "minilm", "--energy", "0.9,2"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--energy" in r.stderr, r.stderr
    with pytest.raises(HeadRankError, match="energy"):
        analyze("minilm", energy="x")
