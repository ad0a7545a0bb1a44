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
    from attnrank.analysis.scan import SpectraResult, analyze, save, spectra
    from attnrank.analysis.tracker import RankTracker
    from attnrank.training.integrations import RankCallback
    from attnrank.training.optim import param_groups

__all__ = ["AttnRankError", "RankCallback", "RankTracker", "SpectraResult", "analyze", "param_groups", "save", "spectra",
           "__version__"]
# public name -> module that defines it, imported on first use (importing attnrank stays cheap:
# no torch, pandas or matplotlib until one of these is touched)
_LAZY = {
    "SpectraResult": "attnrank.analysis.scan",
    "analyze": "attnrank.analysis.scan",
    "spectra": "attnrank.analysis.scan",
    "save": "attnrank.analysis.scan",
    "RankTracker": "attnrank.analysis.tracker",
    "RankCallback": "attnrank.training.integrations",
    "param_groups": "attnrank.training.optim",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'attnrank' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
