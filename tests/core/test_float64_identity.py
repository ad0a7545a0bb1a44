"""``--precision float64`` reproduces, bit for bit, the outputs the code wrote before the
Product/precision refactor (tests/core/fixtures/float64_outputs.npz, recorded from the unmodified
code by make_float64_outputs.py): heads.csv, spectra.npz and rotary.csv of MiniLM, a tiny GQA
Llama and its partial-rotary twin, each run as a user runs it (a fresh interpreter)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.core.fixtures.make_float64_outputs import record

FIXTURE = Path(__file__).parent / "fixtures" / "float64_outputs.npz"


@pytest.mark.parametrize("threads", ["1", "2"])
def test_precision_float64_is_bit_identical_to_the_recorded_outputs(threads):
    with np.load(FIXTURE) as z:
        want = {k: z[k] for k in z.files}
    got = record(["--precision", "float64", "--threads", threads])
    missing = sorted(set(want) - set(got))
    assert not missing, missing
    for key, value in want.items():  # columns added since (other metrics) are not compared
        if value.dtype.kind == "U":
            assert (got[key] == value).all(), key
        else:
            assert got[key].shape == value.shape, key
            assert np.array_equal(got[key], value, equal_nan=True), (key, np.nanmax(np.abs(got[key] - value)))
