"""Shared LM-study helpers: ranks from spectra, exposure, the noise floor (verdict statistics: test_verdicts.py)."""


import numpy as np
import pytest

from attnrank.studies.lm_common import (
    effective_rank,
    lambdas_for,
    lm_base,
    lr_sum,
    noise_floors,
    numerical_rank,
)


def test_ranks_from_singular_values():
    sv = np.array([[4.0, 2.0, 1e-4, 0.0], [1.0, 1.0, 1.0, 1.0]])
    np.testing.assert_array_equal(numerical_rank(sv, 1e-3), [2, 4])
    np.testing.assert_array_equal(numerical_rank(sv, 0.6), [1, 4])
    assert effective_rank(sv)[1] == pytest.approx(4.0)
    p = np.array([4, 2, 1e-4]) / (6 + 1e-4)
    assert effective_rank(sv)[0] == pytest.approx(np.exp(-(p * np.log(p)).sum()))


def test_lambdas_for_exposure_and_noise_floor_falls_with_decay():
    base = {**lm_base(60), "weight_decay": 0.1}
    s = lr_sum("lm", base)
    assert s == pytest.approx(3e-3 * (60 * 61 / 2) / 100)  # 60 steps, all in the 100-step warmup
    lams = lambdas_for((0.0, 8.0), s)
    assert lams[0] == 0.0 and lams[1] * s == pytest.approx(8.0, rel=1e-3)
    f = noise_floors("lm", base, lams)
    assert f[0] > f[1] > 0


def test_lambdas_round_up_so_the_exposure_is_reached():
    for s in (0.7515, 0.30015, 0.2505, 2.85, 0.0063):
        for e, lam in zip((1.0, 3.0, 8.0), lambdas_for((1.0, 3.0, 8.0), s), strict=True):
            assert e <= lam * s < e * 1.002
