"""attnrank: how weight decay and architecture shape the rank of attention layers.

The package is layered, each layer importing only from the ones before it (tests/test_layers.py):
``util`` → ``core`` → ``io`` → ``models`` → ``analysis`` → ``training`` → ``studies`` →
``report`` → ``cli``. The public entry points below are loaded on first use, so importing a
low layer (``attnrank.core.linalg``) does not pull in the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attnrank.errors import AttnRankError
from attnrank.util.env import __version__

if TYPE_CHECKING:  # pragma: no cover
    from attnrank.analysis.scan import SpectraResult, analyze, spectra

__all__ = ["AttnRankError", "SpectraResult", "analyze", "spectra", "__version__"]
_LAZY = {"SpectraResult", "analyze", "spectra"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from attnrank.analysis import scan

        return getattr(scan, name)
    raise AttributeError(f"module 'attnrank' has no attribute {name!r}")
