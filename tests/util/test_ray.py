"""util.ray: the one way to reach Ray fails with one clear error when Ray is not installed."""

import sys

import pytest

from attnrank.errors import AttnRankError
from attnrank.util.ray import ray_session


def test_missing_ray_is_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(AttnRankError, match=r"--ray needs Ray: pip install"):
        with ray_session("local"):
            pass
