"""core.product.product_svd (Product.svd): the exact SVD of a factored product against numpy's dense float64
SVD of the formed product (different row counts, rank-deficient and bf16 factors)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headrank.core.product import product_svd
from headrank.util.threads import computing


@pytest.mark.parametrize("m, n, r, rank", [(30, 20, 6, 6), (60, 20, 6, 3), (20, 20, 8, 8), (5, 40, 8, 5)])
def test_matches_dense_svd(m, n, r, rank):
    g = torch.Generator().manual_seed(m + n + r)
    A = torch.randn(3, m, r, generator=g, dtype=torch.float64)
    B = torch.randn(3, n, r, generator=g, dtype=torch.float64)
    if rank < r:  # rank-deficient A: its last columns repeat earlier ones
        A[..., rank:] = A[..., :r - rank]
    U, S, V = product_svd(A, B)
    p = min(m, n, r)
    assert U.shape == (3, m, p) and S.shape == (3, p) and V.shape == (3, n, p)
    for i in range(3):
        M = (A[i] @ B[i].T).numpy()
        s = np.linalg.svd(M, compute_uv=False)[:p]
        assert np.allclose(S[i].numpy(), s, rtol=0, atol=1e-12 * s[0])
        assert np.allclose((U[i] * S[i]) @ V[i].T, M, rtol=0, atol=1e-12 * s[0])
        k = int((s > 1e-9 * s[0]).sum())  # orthonormal where the spectrum is not zero
        assert np.allclose(U[i, :, :k].T @ U[i, :, :k], np.eye(k), atol=1e-10)
        assert np.allclose(V[i, :, :k].T @ V[i, :, :k], np.eye(k), atol=1e-10)


def test_a_batch_mixing_well_and_ill_conditioned_factors():
    g = torch.Generator().manual_seed(5)
    A = torch.randn(4, 30, 6, generator=g, dtype=torch.float64)
    B = torch.randn(4, 25, 6, generator=g, dtype=torch.float64)
    A[1, :, 5] = A[1, :, 0]  # singular: the Householder path
    A[2, :, 5] *= 1e-7  # ill-conditioned
    U, S, V = product_svd(A, B)
    for i in range(4):
        M = (A[i] @ B[i].T).numpy()
        assert np.allclose((U[i] * S[i]) @ V[i].T, M, rtol=0, atol=1e-12 * np.abs(M).max())
        k = int((S[i] > 1e-9 * S[i, 0]).sum())
        assert np.allclose(U[i, :, :k].T @ U[i, :, :k], np.eye(k), atol=1e-10)


def test_bf16_factors_are_upcast_first():
    g = torch.Generator().manual_seed(0)
    A, B = (torch.randn(40, 8, generator=g).to(torch.bfloat16) for _ in range(2))
    with computing(precision="float64"):  # the float64 route (auto: tests/core/test_precision.py)
        _, S, _ = product_svd(A, B)
    ref = np.linalg.svd(A.double().numpy() @ B.double().numpy().T, compute_uv=False)[:8]
    assert S.dtype == torch.float64 and np.allclose(S.numpy(), ref, rtol=1e-12)


def test_shapes_are_checked():
    with pytest.raises(ValueError):
        product_svd(torch.zeros(4, 3), torch.zeros(4, 2))
