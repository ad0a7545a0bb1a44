"""The one record of the environment a result was computed in."""

from __future__ import annotations

import importlib
import platform
import sys
from importlib import metadata

try:
    __version__ = metadata.version("attnrank")
except metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0+source"


def versions() -> dict[str, str]:
    """Versions of Python, the platform and the libraries that shape the numbers."""
    out = {"attnrank": __version__, "python": sys.version.split()[0], "platform": platform.platform()}
    for mod in ("numpy", "scipy", "torch", "matplotlib"):
        try:
            out[mod] = importlib.import_module(mod).__version__
        except Exception:  # noqa: BLE001 - a missing optional library is just not listed
            continue
    return out
