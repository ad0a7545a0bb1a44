"""The one way to reach Ray: connect to a cluster (or start a local one) for the length of a
``with`` block, shutting down only what this block started.

**Token authentication** (Ray ≥ 2.52): a cluster started with ``RAY_AUTH_MODE=token`` accepts
only clients that send its token. Set ``RAY_AUTH_MODE=token`` here too, with the token in
``RAY_AUTH_TOKEN``, in a file named by ``RAY_AUTH_TOKEN_PATH``, or in ``~/.ray/auth_token`` (what
``ray get-auth-token`` prints). Without it Ray retries for ~20 s, printing ``InvalidAuthToken``
lines; :func:`auth_problem` names the missing piece in one line before connecting where it can
tell, and a connection refused for authentication is one line naming these variables."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from headrank.errors import HeadRankError, one_line

_AUTH_HINT = ("set RAY_AUTH_MODE=token and the cluster's token in RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or "
              "~/.ray/auth_token (`ray get-auth-token` on the head node prints it)")


def auth_problem(address: str, env: dict[str, str] | None = None, home: Path | None = None) -> str | None:
    """One line when token authentication cannot work as configured, else None: ``RAY_AUTH_MODE``
    is ``token`` but no token is found (``RAY_AUTH_TOKEN``, the file ``RAY_AUTH_TOKEN_PATH``, or
    ``~/.ray/auth_token``), or ``RAY_AUTH_TOKEN_PATH`` names no readable file."""
    env = os.environ if env is None else env
    home = Path.home() if home is None else home
    mode = env.get("RAY_AUTH_MODE", "").strip().lower()
    path = env.get("RAY_AUTH_TOKEN_PATH")
    if path and not Path(path).expanduser().is_file():
        return f"RAY_AUTH_TOKEN_PATH={path} is not a file holding the Ray token: {_AUTH_HINT}"
    if mode == "token" and address != "local":
        found = env.get("RAY_AUTH_TOKEN", "").strip() or path or (home / ".ray" / "auth_token").is_file()
        if not found:
            return f"RAY_AUTH_MODE=token but no Ray token is set for the cluster at {address!r}: {_AUTH_HINT}"
    return None


def _auth_error(text: str) -> bool:
    low = text.lower()
    return any(k in low for k in ("invalidauthtoken", "unauthenticated", "auth token", "authentication"))


@contextmanager
def ray_session(address: str) -> Iterator[Any]:
    """Yield the ``ray`` module connected to ``address`` (``local``: a Ray started here, or
    ``auto`` / ``HOST:PORT``: an existing cluster); one clear error when Ray is missing or the
    cluster cannot be reached."""
    try:
        import ray
    except ImportError:
        raise HeadRankError("`ray` needs Ray: pip install 'headrank[ray]'") from None
    started = not ray.is_initialized()
    if started:
        problem = auth_problem(address)
        if problem:
            raise HeadRankError(problem)
        try:
            ray.init(address=None if address == "local" else address, include_dashboard=False,
                     log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as e:
            text = one_line(e, None, typed=True)
            if _auth_error(text):
                raise HeadRankError(f"Ray at {address!r} refused this client's authentication: {_AUTH_HINT}") from None
            if "Could not find any running Ray instance" in text:  # Ray's hint names its own `--address` flag
                raise HeadRankError(f"`ray` {address}: no running Ray cluster found (start one with Ray's own "
                                    "`ray start` command on its head node, or give `ray` HOST:PORT, or local to start "
                                    "Ray here)") from None
            raise HeadRankError(f"`ray` {address}: cannot connect to Ray: {one_line(e, 200)}") from None
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()
