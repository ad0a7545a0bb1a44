"""headrank: how weight decay and architecture shape the rank of attention layers.

The package is layered, each layer importing only from the ones before it (tests/test_layers.py):
``util`` → ``core`` → ``io`` → ``models`` → ``analysis`` → ``compress`` → ``training`` → ``studies`` →
``report`` → ``cli``. The public entry points below are loaded on first use, so importing a
low layer (``headrank.core.linalg``) does not pull in the rest.

Every command of the CLI is a function here (:data:`VERBS`: ``spectra``, ``compress``, ``track``,
``collapse``, ``scale``, ``train``, ``sweep``, ``reproduce``), taking what the command takes and
returning a result with one contract (``table``, ``meta``, ``summary()``, ``save``, ``load``,
``plot()``, ``to_json()``; docs/python.md).
"""

from __future__ import annotations

from headrank.errors import HeadRankError

# `import headrank` stays light (no typing, no importlib.metadata: __version__ is loaded on first
# use), so that the command line's Ctrl-C handler is in place a few milliseconds after start-up
TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Any

    from headrank.analysis.collapse.analyze import CollapseResult
    from headrank.analysis.collapse.analyze import collapse as collapse
    from headrank.analysis.scaling.analyze import ScaleResult
    from headrank.analysis.scaling.analyze import scale as scale
    from headrank.analysis.scan import HeadSpectrum, SpectraResult, analyze, save, spectra
    from headrank.analysis.series import SeriesResult
    from headrank.analysis.series import track as track
    from headrank.analysis.tracker import RankTracker
    from headrank.compress import CompressResult, load_compressed
    from headrank.compress import compress as compress
    from headrank.report.result import ReproduceResult
    from headrank.report.result import reproduce as reproduce
    from headrank.training.integrations import RankCallback
    from headrank.training.lightning import RankLightningCallback
    from headrank.training.loop import RunResult
    from headrank.training.loop import train_task as train
    from headrank.training.optim import (
        AttnDecayTrainer,
        ParamGroups,
        decay_exposure,
        hf_optimizer_cls_and_kwargs,
        optimizer,
        param_groups,
        track_exposure,
    )
    from headrank.training.sweep import SweepResult
    from headrank.training.sweep import sweep_verb as sweep
    from headrank.util.env import __version__ as __version__

#: the CLI's verbs, each a function taking what the verb takes (docs/python.md)
VERBS = ("spectra", "compress", "track", "collapse", "scale", "train", "sweep", "reproduce")

__all__ = ["AttnDecayTrainer", "CollapseResult", "CompressResult", "HeadRankError", "HeadSpectrum", "ParamGroups",
           "RankCallback", "RankLightningCallback", "RankTracker", "ReproduceResult", "RunResult", "ScaleResult",
           "SeriesResult", "SpectraResult", "SweepResult", "__version__", "analyze", "collapse", "compress",
           "decay_exposure", "hf_optimizer_cls_and_kwargs", "load_compressed", "optimizer", "param_groups",
           "reproduce", "save", "scale", "spectra", "sweep", "track", "track_exposure", "train"]
# public name -> (module that defines it, its name there), imported on first use (importing
# headrank stays cheap: no torch, pandas or matplotlib until one of these is touched)
_LAZY = {
    "__version__": ("headrank.util.env", "__version__"),
    "spectra": ("headrank.analysis.scan", "spectra"),
    "analyze": ("headrank.analysis.scan", "analyze"),
    "save": ("headrank.analysis.scan", "save"),
    "SpectraResult": ("headrank.analysis.scan", "SpectraResult"),
    "HeadSpectrum": ("headrank.analysis.scan", "HeadSpectrum"),
    "compress": ("headrank.compress", None),  # the package, callable as the verb (compress/__init__)
    "CompressResult": ("headrank.compress", "CompressResult"),
    "load_compressed": ("headrank.compress", "load_compressed"),
    "collapse": ("headrank.analysis.collapse.analyze", "collapse"),
    "CollapseResult": ("headrank.analysis.collapse.analyze", "CollapseResult"),
    "scale": ("headrank.analysis.scaling.analyze", "scale"),
    "ScaleResult": ("headrank.analysis.scaling.analyze", "ScaleResult"),
    "track": ("headrank.analysis.series", "track"),
    "SeriesResult": ("headrank.analysis.series", "SeriesResult"),
    "train": ("headrank.training.loop", "train_task"),
    "RunResult": ("headrank.training.loop", "RunResult"),
    "sweep": ("headrank.training.sweep", "sweep_verb"),
    "SweepResult": ("headrank.training.sweep", "SweepResult"),
    "reproduce": ("headrank.report.result", "reproduce"),
    "ReproduceResult": ("headrank.report.result", "ReproduceResult"),
    "RankTracker": ("headrank.analysis.tracker", "RankTracker"),
    "RankCallback": ("headrank.training.integrations", "RankCallback"),
    "param_groups": ("headrank.training.optim", "param_groups"),
    "ParamGroups": ("headrank.training.optim", "ParamGroups"),
    "optimizer": ("headrank.training.optim", "optimizer"),
    "decay_exposure": ("headrank.training.optim", "decay_exposure"),
    "track_exposure": ("headrank.training.optim", "track_exposure"),
    "hf_optimizer_cls_and_kwargs": ("headrank.training.optim", "hf_optimizer_cls_and_kwargs"),
    "AttnDecayTrainer": ("headrank.training.optim", "AttnDecayTrainer"),
    "RankLightningCallback": ("headrank.training.lightning", "RankLightningCallback"),
}


def __getattr__(name: str) -> Any:
    if name == "__version__":  # the installed metadata, read on first use (importlib.metadata: ~50 ms)
        from headrank.util.env import __version__

        return __version__
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        found = importlib.import_module(module)
        return found if attr is None else getattr(found, attr)
    raise AttributeError(f"module 'headrank' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
