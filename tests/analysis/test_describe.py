"""`result.describe()` (one wide row per layer, WeightWatcher style, with a source column) and
`result.plot()`; heads.csv carries gap_rel and the source."""

import numpy as np
import pandas as pd
import pytest

from headrank import analyze


@pytest.fixture(scope="module")
def result():
    return analyze("minilm", layers="0-2", tol=1e-3)


def test_describe_is_one_wide_row_per_layer(result):
    d = result.describe()
    assert list(d["layer"]) == [0, 1, 2] and (d["source"] == str(result.meta["source"])).all()
    assert list(d.columns[:6]) == ["layer", "source", "model_type", "heads", "head_dim", "qk_effective_rank"]
    assert (d["heads"] == 12).all() and (d["head_dim"] == 32).all() and (d["model_type"] == "bert").all()
    t = result.table
    for layer in (0, 2):
        for p in ("qk", "ov"):
            rows = t[(t["layer"] == layer) & (t["product"] == p)]
            assert len(rows) == 12
            for m in ("effective_rank", "gap_rel", "nuclear", "rank"):
                assert d.loc[d["layer"] == layer, f"{p}_{m}"].item() == pytest.approx(rows[m].to_numpy().mean(),
                                                                                      rel=1e-12)
    cols = list(d.columns)
    assert cols.index("qk_effective_rank") < cols.index("qk_rank") < cols.index("ov_effective_rank")


def test_plot_and_heads_csv(result, tmp_path):
    fig = result.plot(tmp_path / "r.png")
    assert (tmp_path / "r.png").stat().st_size > 10_000
    assert "minilm" in fig._suptitle.get_text() and "/" not in fig._suptitle.get_text().split(" ")[0]
    result.save(tmp_path / "o", plots=False)
    heads = pd.read_csv(tmp_path / "o" / "heads.csv")
    assert {"gap_rel", "source"} <= set(heads.columns) and (heads["source"] == str(result.meta["source"])).all()
    np.testing.assert_allclose(heads["gap_rel"], heads["gap"] / heads["frob_bound"], rtol=1e-12)
