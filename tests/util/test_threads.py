"""Thread and worker counts are bounded by the CPUs (issue 27: a million threads crashed OpenBLAS)."""

import pytest
import torch

from headrank.errors import HeadRankError
from headrank.util.threads import PER_CPU, check_threads, cpus, max_threads, torch_threads


def test_counts_from_one_to_four_per_cpu():
    assert max_threads() == PER_CPU * cpus() and check_threads(1) == 1 and check_threads(max_threads()) == max_threads()
    for bad in (0, -1, max_threads() + 1, 1_000_000, 10_000_000_000):
        with pytest.raises(HeadRankError, match=rf"`threads` must lie in 1\.\.{max_threads()} .*got {bad}"):
            check_threads(bad)
    for bad in (True, 2.0, "2", None):
        with pytest.raises(HeadRankError, match="`workers` must be an integer"):
            check_threads(bad, "workers")


def test_torch_threads_refuses_before_touching_torch():
    before = torch.get_num_threads()
    with pytest.raises(HeadRankError, match="`threads` must lie in"):
        with torch_threads(1_000_000):
            pass
    assert torch.get_num_threads() == before
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
