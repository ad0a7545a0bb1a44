"""util.ray: the one way to reach Ray fails with one clear error when Ray is not installed."""

import sys

import pytest

from headrank.errors import HeadRankError
from headrank.util.ray import ray_session


def test_missing_ray_is_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(HeadRankError, match=r"`ray` needs Ray: pip install"):
        with ray_session("local"):
            pass


def test_token_auth_misconfiguration_is_one_line_before_connecting(tmp_path):
    from headrank.util.ray import auth_problem

    home = tmp_path / "home"
    home.mkdir()
    assert auth_problem("auto", {}, home) is None  # no token auth asked: nothing to say
    line = auth_problem("10.0.0.1:6379", {"RAY_AUTH_MODE": "token"}, home)
    assert "RAY_AUTH_MODE=token but no Ray token" in line and "~/.ray/auth_token" in line
    assert auth_problem("auto", {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "abc"}, home) is None
    (home / ".ray").mkdir()
    (home / ".ray" / "auth_token").write_text("abc")
    assert auth_problem("auto", {"RAY_AUTH_MODE": "token"}, home) is None
    assert "is not a file" in auth_problem("auto", {"RAY_AUTH_TOKEN_PATH": str(tmp_path / "none")}, home)


def test_ray_session_refuses_token_mode_without_a_token(monkeypatch, tmp_path):
    pytest.importorskip("ray")
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(HeadRankError, match="no Ray token is set"):
        with ray_session("127.0.0.1:1"):
            pass
