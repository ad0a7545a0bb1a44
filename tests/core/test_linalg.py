"""linalg against dense float64 linear algebra (numpy SVD of the formed d×d product)."""

import numpy as np
import pytest
import torch

from headrank.core.linalg import (
    METRIC_COLUMNS,
    factor_root,
    product_metrics,
    rank_measures,
    singular_values,
)
from headrank.util.threads import computing
from tests.core.test_metrics import dense_reference


def assert_matches_dense(A: torch.Tensor, B: torch.Tensor, tol: float = 1e-3) -> None:
    m = product_metrics(A, B, tol=tol)
    An = A.double().numpy().reshape(-1, *A.shape[-2:])
    Bn = B.double().numpy().reshape(-1, *B.shape[-2:])
    flat = {k: getattr(m, k).reshape(-1, *getattr(m, k).shape[A.ndim - 2:]) for k in ("sv", *METRIC_COLUMNS)}
    for i in range(An.shape[0]):
        ref = dense_reference(An[i], Bn[i], tol)
        s_ours, s_ref = flat["sv"][i].numpy(), ref["sv"]
        big = s_ref >= 1e-6 * s_ref[0]
        np.testing.assert_allclose(s_ours[big], s_ref[big], rtol=1e-6)
        for k in METRIC_COLUMNS:
            got, want = float(flat[k][i]), float(ref[k])
            if k == "gap":  # a difference of two large numbers: compare at the bound's scale
                assert abs(got - want) <= 1e-9 * float(ref["frob_bound"]), (k, got, want)
            elif k in ("rank", "k90", "k99"):
                assert got == want, (k, got, want)
            else:
                assert got == pytest.approx(want, rel=1e-6, abs=1e-12 * float(ref["frob_bound"])), (k, got, want)


def test_random_factors_batched():
    g = torch.Generator().manual_seed(0)
    A = torch.randn(3, 4, 48, 8, generator=g, dtype=torch.float64)
    B = torch.randn(3, 4, 48, 8, generator=g, dtype=torch.float64)
    assert_matches_dense(A, B)
    assert product_metrics(A, B).sv.shape == (3, 4, 8)


def test_planted_rank():
    g = torch.Generator().manual_seed(1)
    d, dh, r = 64, 16, 5
    A = torch.randn(6, d, r, generator=g, dtype=torch.float64) @ torch.randn(6, r, dh, generator=g, dtype=torch.float64)
    B = torch.randn(6, d, dh, generator=g, dtype=torch.float64)
    m = product_metrics(A, B)
    assert (m.rank == r).all()
    assert (m.sv[:, r:] <= 1e-12 * m.sv[:, :1]).all()
    assert_matches_dense(A, B)


@pytest.mark.parametrize("decades", [3.9, 5.0])  # just inside the Gram path (κ² < 1e8), and past it (QR)
def test_badly_scaled_factors(decades):
    g = torch.Generator().manual_seed(2)
    d, dh = 40, 10
    cols = torch.logspace(0, -decades, dh, dtype=torch.float64)
    A = torch.randn(4, d, dh, generator=g, dtype=torch.float64) * cols
    B = torch.randn(4, d, dh, generator=g, dtype=torch.float64) * cols.flip(0) * 1e3
    assert_matches_dense(A, B)
    # an overall scale of 1e±30 changes no scale-free measure
    for c in (1e-30, 1e30):
        m0, m1 = product_metrics(A, B), product_metrics(A * c, B)
        for k in ("rank", "effective_rank", "stable_rank"):
            torch.testing.assert_close(getattr(m1, k), getattr(m0, k), rtol=1e-9, atol=0)
        torch.testing.assert_close(m1.sv, m0.sv * c, rtol=1e-9, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_low_precision_inputs_are_analysed_as_stored(dtype):
    g = torch.Generator().manual_seed(3)
    A = torch.randn(2, 5, 32, 8, generator=g).to(dtype)
    B = torch.randn(2, 5, 32, 8, generator=g).to(dtype)
    with computing(precision="float64"):  # the float64 route (auto: tests/core/test_precision.py)
        assert_matches_dense(A, B)  # reference: the stored values upcast to float64


def test_wide_heads_d_smaller_than_dh():
    g = torch.Generator().manual_seed(4)
    A = torch.randn(3, 6, 10, generator=g, dtype=torch.float64)
    B = torch.randn(3, 6, 10, generator=g, dtype=torch.float64)
    assert product_metrics(A, B).sv.shape == (3, 6)
    assert_matches_dense(A, B)


def test_balanced_factors_attain_the_bound_prop_3_1():
    """A = U S^½ Oᵀ, B = V S^½ Oᵀ is balanced: nuclear norm equals ½(‖A‖²+‖B‖²)."""
    g = torch.Generator().manual_seed(5)
    d, dh = 30, 6
    U, _ = torch.linalg.qr(torch.randn(d, dh, generator=g, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(d, dh, generator=g, dtype=torch.float64))
    O, _ = torch.linalg.qr(torch.randn(dh, dh, generator=g, dtype=torch.float64))
    s = torch.rand(dh, generator=g, dtype=torch.float64) * 3
    A, B = U * s.sqrt() @ O.T, V * s.sqrt() @ O.T
    m = product_metrics(A, B)
    assert abs(float(m.gap)) <= 1e-13 * float(m.frob_bound)
    assert float(m.balance_rel) <= 1e-13
    # rescaling one factor unbalances it: a strict gap opens
    m2 = product_metrics(2 * A, B / 2)
    assert float(m2.gap) > 0.1 * float(m2.frob_bound)
    torch.testing.assert_close(m2.nuclear, m.nuclear)


def test_nonfinite_heads_are_flagged_not_fatal():
    g = torch.Generator().manual_seed(6)
    A = torch.randn(4, 20, 5, generator=g)
    B = torch.randn(4, 20, 5, generator=g)
    A[2, 3, 1] = float("nan")
    B[3, 0, 0] = float("inf")
    m = product_metrics(A, B)
    assert m.finite.tolist() == [True, True, False, False]
    assert torch.isnan(m.nuclear[2:]).all() and torch.isnan(m.sv[2:]).all()
    clean = product_metrics(A[:2], B[:2])
    torch.testing.assert_close(m.sv[:2], clean.sv)


def test_zero_product_and_rank_measures():
    z = torch.zeros(2, 10, 4)
    m = product_metrics(z, z)
    assert (m.rank == 0).all() and (m.effective_rank == 0).all() and (m.stable_rank == 0).all()
    assert (m.balance_rel == 0).all()
    r = rank_measures(torch.tensor([[2.0, 2.0, 0.0, 0.0]]), tol=1e-3)
    assert r["rank"].item() == 2
    assert r["effective_rank"].item() == pytest.approx(2.0)
    assert r["stable_rank"].item() == pytest.approx(2.0)


def test_tolerance_changes_numerical_rank_only():
    sv = torch.tensor([[1.0, 1e-2, 1e-4, 1e-6]], dtype=torch.float64)
    assert rank_measures(sv, 1e-3)["rank"].item() == 2
    assert rank_measures(sv, 1e-5)["rank"].item() == 3
    with pytest.raises(ValueError):
        rank_measures(sv, 0.0)


def test_shape_mismatch_is_rejected():
    with pytest.raises(ValueError):
        singular_values(torch.zeros(5, 3), torch.zeros(5, 4))


@pytest.mark.parametrize("decades", [0.0, 6.0])
def test_factor_root_reproduces_gram(decades):
    g = torch.Generator().manual_seed(7)
    X = torch.randn(3, 50, 8, generator=g, dtype=torch.float64) * torch.logspace(0, -decades, 8, dtype=torch.float64)
    R = factor_root(X)
    torch.testing.assert_close(R.mT @ R, X.mT @ X, rtol=0, atol=1e-13 * float((X**2).sum(-2).max()))


def test_chunked_reduction_matches_dense(monkeypatch):
    """Many heads are reduced a few at a time (CHUNK_BYTES); chunk borders change nothing."""
    import headrank.core.linalg as la

    g = torch.Generator().manual_seed(8)
    d, dh = 40, 10
    A = torch.randn(3, 4, d, dh, generator=g, dtype=torch.float64)
    B = torch.randn(3, 4, d, dh, generator=g, dtype=torch.float64)
    A[1, 2] *= torch.logspace(0, -6, dh, dtype=torch.float64)  # this head takes the QR path
    A[2, 1] = A[2, 1, :, :3] @ torch.randn(3, dh, generator=g, dtype=torch.float64)  # rank 3
    whole = product_metrics(A, B)
    monkeypatch.setattr(la, "CHUNK_BYTES", 8 * d * dh * 5)  # 5 heads per chunk: borders inside rows
    assert_matches_dense(A, B)
    chunked = product_metrics(A, B)
    assert chunked.sv.shape == (3, 4, dh) and int(chunked.rank[2, 1]) == 3
    torch.testing.assert_close(chunked.sv, whole.sv, rtol=1e-12, atol=1e-12 * float(whole.sv.max()))
    A[0, 3, 5, 5] = float("nan")
    assert product_metrics(A, B).finite.reshape(-1).tolist() == [i != 3 for i in range(12)]


def test_workers_change_no_bit():
    """Heads shared among threads (fixed chunks) give exactly the serial result."""
    from headrank.util.threads import torch_threads

    g = torch.Generator().manual_seed(9)
    A = torch.randn(5, 40, 10, generator=g).to(torch.bfloat16)
    B = torch.randn(5, 40, 10, generator=g).to(torch.bfloat16)
    A[3] = A[3].double().mul(torch.logspace(0, -6, 10, dtype=torch.float64)).to(torch.bfloat16)  # QR path
    for precision in ("float64", "auto"):
        with computing(precision=precision):
            serial = product_metrics(A, B)
            with torch_threads(1), computing(threads=3):
                par = product_metrics(A, B)
        for k in ("sv", *METRIC_COLUMNS, "finite"):
            assert torch.equal(getattr(par, k), getattr(serial, k)), (precision, k)
    with computing(precision="float64"):
        assert_matches_dense(A, B)


@pytest.mark.parametrize("decades, certified", [(0.0, True), (3.0, True), (4.5, False), (6.0, False)])
def test_gram_condition_certificate(decades, certified):
    """The Gram path is taken only where λ_min ≥ 1e-8 λ_max is proven (κ(X)² = 10^(2·decades))."""
    from headrank.core.linalg import _gram_certified

    g = torch.Generator().manual_seed(10)
    Q, _ = torch.linalg.qr(torch.randn(64, 8, generator=g, dtype=torch.float64))
    X = Q * torch.logspace(0, -decades, 8, dtype=torch.float64)  # singular values exactly these
    G = X.mT @ X
    R = torch.linalg.cholesky(G).mT
    assert bool(_gram_certified(G, R)) is certified
    assert not bool(_gram_certified(torch.zeros(8, 8, dtype=torch.float64), torch.zeros(8, 8, dtype=torch.float64)))


@pytest.mark.parametrize("layout", ["rows", "columns"])
def test_gram_buffers_in_both_layouts_match_dense(layout):
    """A projection's head block (``W_h`` rows: Xᵀ contiguous) and a column block of W_O (X's
    rows strided) are upcast into different buffer layouts for the symmetric rank-k Gram; both
    give the root of the float64 Gram of the stored (bf16) values, and a reused buffer from a
    larger call changes nothing."""
    import headrank.core.linalg as la

    g = torch.Generator().manual_seed(11)
    H, d, dh = 5, 96, 12
    if layout == "rows":
        W = torch.randn(H * dh, d, generator=g).to(torch.bfloat16)
        X = W.reshape(H, dh, d).mT  # (H, d, dh), stride(-2) == 1
    else:
        O = torch.randn(d, H * dh, generator=g).to(torch.bfloat16)
        X = O.reshape(d, H, dh).permute(1, 0, 2)  # (H, d, dh), rows of length dh, stride H·dh
    la.factor_root(torch.randn(40, 2 * d, dh, generator=g))  # leaves a larger buffer in the pool
    with computing(precision="float64"):  # the float64 route's buffers (auto: tests/core/test_precision.py)
        R, R2 = factor_root(X), factor_root(X.contiguous())
    Xd = X.double().numpy()
    for h in range(H):
        G = Xd[h].T @ Xd[h]
        np.testing.assert_allclose((R[h].mT @ R[h]).numpy(), G, rtol=0, atol=1e-13 * np.abs(G).max())
    torch.testing.assert_close(R, R2, rtol=1e-13, atol=1e-13 * float(R.abs().max()))


@pytest.mark.parametrize("n", [1, 5, 32, 33, 100, 128, 200])
def test_triangular_inverse_by_halves_against_lapack(n):
    """``_triu_inv`` (the certificate's R⁻¹ on the numpy route, by halves) against numpy's LU
    inverse and the identity, batched, with a badly scaled diagonal; an exactly singular R
    raises as ``np.linalg.inv`` does."""
    from headrank.core.linalg import _triu_inv

    rng = np.random.default_rng(n)
    R = np.triu(rng.standard_normal((3, n, n)))
    R[:, np.arange(n), np.arange(n)] = np.logspace(0, -3, n) * rng.choice([-1, 1], n)
    inv = _triu_inv(R)
    ref = np.linalg.inv(R)
    assert np.array_equal(np.tril(inv, -1), np.zeros_like(inv))  # upper triangular, exactly
    assert np.abs(inv - ref).max() <= 1e-12 * np.abs(ref).max()
    assert np.abs(inv @ R - np.eye(n)).max() <= 1e-12 * np.abs(ref).max() * np.abs(R).max()
    R[1, n // 2, n // 2] = 0.0
    with pytest.raises(np.linalg.LinAlgError):
        _triu_inv(R)


@pytest.mark.parametrize("decades, certified", [(0.0, True), (3.0, True), (4.5, False), (6.0, False)])
def test_gram_condition_certificate_numpy(decades, certified):
    """The numpy route's certificate (R⁻¹ by halves) proves what the torch route's does."""
    from headrank.core.linalg import _gram_certified

    rng = np.random.default_rng(10)
    Q, _ = np.linalg.qr(rng.standard_normal((256, 64)))
    X = Q * np.logspace(0, -decades, 64)
    G = X.T @ X
    R = np.linalg.cholesky(G, upper=True)
    assert bool(_gram_certified(G[None], R[None])[0]) is certified
    assert not _gram_certified(np.zeros((1, 64, 64)), np.zeros((1, 64, 64)))[0]
