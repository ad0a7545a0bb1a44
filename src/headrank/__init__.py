"""headrank: how weight decay and architecture shape the rank of attention layers.

The package is layered, each layer importing only from the ones before it (tests/test_layers.py):
``util`` → ``core`` → ``io`` → ``models`` → ``analysis`` → ``training`` → ``studies`` →
``report`` → ``cli``. The public entry points below are loaded on first use, so importing a
low layer (``headrank.core.linalg``) does not pull in the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from headrank.errors import HeadRankError
from headrank.util.env import __version__

if TYPE_CHECKING:  # pragma: no cover
    from headrank.analysis.compress import CompressResult, compress, load_compressed
    from headrank.analysis.scan import SpectraResult, analyze, save, spectra
    from headrank.analysis.tracker import RankTracker
    from headrank.training.integrations import RankCallback
    from headrank.training.optim import param_groups

__all__ = ["CompressResult", "HeadRankError", "RankCallback", "RankTracker", "SpectraResult", "analyze", "compress",
           "load_compressed", "param_groups", "save", "spectra", "__version__"]
# public name -> module that defines it, imported on first use (importing headrank stays cheap:
# no torch, pandas or matplotlib until one of these is touched)
_LAZY = {
    "SpectraResult": "headrank.analysis.scan",
    "analyze": "headrank.analysis.scan",
    "spectra": "headrank.analysis.scan",
    "save": "headrank.analysis.scan",
    "RankTracker": "headrank.analysis.tracker",
    "compress": "headrank.analysis.compress",
    "CompressResult": "headrank.analysis.compress",
    "load_compressed": "headrank.analysis.compress",
    "RankCallback": "headrank.training.integrations",
    "param_groups": "headrank.training.optim",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'headrank' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
