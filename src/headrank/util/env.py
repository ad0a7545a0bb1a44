"""The one record of the environment a result was computed in."""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from pathlib import Path

try:
    __version__ = metadata.version("headrank")
except metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0+source"


def _platform() -> str:
    """``platform.platform()``'s text without its ``uname -p`` subprocess (~30 ms a run): the
    kernel, its release, the machine and the C library."""
    if not hasattr(os, "uname"):  # pragma: no cover - not POSIX
        return platform.platform()
    u = os.uname()
    lib, ver = platform.libc_ver()
    return "-".join([u.sysname, u.release, u.machine, *(["with", lib + ver] if lib else [])])


def versions() -> dict[str, str]:
    """Versions of Python, the platform and the libraries that shape the numbers."""
    out = {"headrank": __version__, "python": sys.version.split()[0], "platform": _platform()}
    for mod in ("numpy", "scipy", "torch", "matplotlib"):
        try:  # a library not loaded yet is looked up, not imported (matplotlib alone took 0.2 s)
            loaded = sys.modules.get(mod)
            out[mod] = loaded.__version__ if loaded is not None else metadata.version(mod)
        except Exception:  # noqa: BLE001 - a missing optional library is just not listed
            continue
    return out


def cache_root() -> Path:
    """The one cache root: ``$HEADRANK_CACHE``, else ``$XDG_CACHE_HOME/headrank`` (default
    ``~/.cache/headrank``)."""
    root = os.environ.get("HEADRANK_CACHE")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")) / "headrank"
