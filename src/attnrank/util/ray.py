"""The one way to reach Ray: connect to a cluster (or start a local one) for the length of a
``with`` block, shutting down only what this block started."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from attnrank.errors import AttnRankError


@contextmanager
def ray_session(address: str) -> Iterator[Any]:
    """Yield the ``ray`` module connected to ``address`` (``local``: a Ray started here, or
    ``auto`` / ``HOST:PORT``: an existing cluster); one clear error when Ray is missing or the
    cluster cannot be reached."""
    try:
        import ray
    except ImportError:
        raise AttnRankError("--ray needs Ray: pip install 'attnrank[ray]'") from None
    started = not ray.is_initialized()
    if started:
        try:
            ray.init(address=None if address == "local" else address, include_dashboard=False,
                     log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise AttnRankError(f"cannot connect to Ray at {address!r}: {' '.join(str(e).split())[:200]}") from None
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()
