"""A factored ``compress`` output read as a checkpoint (docs/compress.md, "Loading a factored output").

``factored.json`` names each shrunk projection, whether its rows (a projection into the heads) or
its columns (the output projection) were kept, and which (``[start, stop)`` runs); every other
row or column of the cut tensor is exactly zero. :class:`FactoredCheckpoint` reads the weight
files as :class:`~headrank.io.checkpoint.Checkpoint` does and gives each shrunk tensor back at
its full shape, the kept rows (columns) in place and zeros elsewhere: the tensor the same cut
writes with ``format`` dense, bit for bit, so ``spectra`` and ``track`` of a factored output are
those of the dense one. :func:`manifest` is the one check of ``factored.json`` (also used by
:func:`headrank.compress.load_compressed`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from headrank.errors import HeadRankError
from headrank.io.checkpoint import Checkpoint, Located
from headrank.io.tensor_source import TensorMeta
from headrank.io.validate import bounded, read_json, regular_file

MANIFEST = "factored.json"
FORMAT = "headrank-factored"
STEM = "factored-model"  # not `model`: see headrank.compress.factored
_SPEC_KEYS = {"keep", "features", "index", "role"}
_ROLE_KEEP = {"v": "rows", "q": "rows", "k": "rows", "o": "cols"}
MAX_MODULE_NAME = 1000


def manifest(path: Path) -> dict[str, dict[str, Any]]:
    """``factored.json``'s modules, each spec checked: keys, keep and role, features bounded, index
    runs ``[start, stop)`` of integers, sorted, disjoint, inside ``[0, features)``."""
    p = path / MANIFEST
    try:
        regular_file(p, "factored manifest")
    except HeadRankError:
        if not p.exists():
            raise HeadRankError(f"{path} holds no {MANIFEST}: not a factored compress output (a `format` dense "
                                "output loads with transformers' from_pretrained)") from None
        raise
    m = read_json(p, "factored manifest")
    if not isinstance(m, dict) or m.get("format") != FORMAT or not isinstance(m.get("modules"), dict):
        raise HeadRankError(f"{p}: not a headrank factored manifest")
    mods = m["modules"]
    if not mods:
        raise HeadRankError(f"{p}: names no module (a factored output shrinks at least one projection)")
    bounded(len(mods), "count", "the number of modules", str(p))
    return {_name(name, p): _spec(spec, f"{p}: module {name[:80]!r}") for name, spec in mods.items()}


def _name(name: str, p: Path) -> str:
    if not name or len(name) > MAX_MODULE_NAME or not all(part.isidentifier() or part.isdigit()
                                                           for part in name.split(".")):
        raise HeadRankError(f"{p}: {name[:80]!r} is not a module name")
    return name


def _spec(spec: Any, where: str) -> dict[str, Any]:
    if not isinstance(spec, dict):
        raise HeadRankError(f"{where}: its entry must be an object; got {type(spec).__name__}")
    if not _SPEC_KEYS - {"role"} <= set(spec) <= _SPEC_KEYS:  # an older headrank wrote no role
        odd = sorted(set(spec) ^ _SPEC_KEYS)
        raise HeadRankError(f"{where}: its entry must hold {sorted(_SPEC_KEYS)} (role optional); differs in {odd}")
    role, keep = spec.get("role"), spec["keep"]
    if keep not in ("rows", "cols") or (role is not None and (not isinstance(role, str) or role not in _ROLE_KEEP
                                                              or keep != _ROLE_KEEP[role])):
        raise HeadRankError(f"{where}: role {str(role)[:20]!r} with keep {str(keep)[:20]!r} is not one of "
                            f"{', '.join(f'{r}/{k}' for r, k in _ROLE_KEEP.items())}")
    features = bounded(spec["features"], "ffn", "features", where)
    runs = spec["index"]
    if not isinstance(runs, list) or not runs or len(runs) > features:
        raise HeadRankError(f"{where}: index must be a list of 1 to {features:,} [start, stop) runs")
    at = 0
    for r in runs:
        if not (isinstance(r, list) and len(r) == 2):
            raise HeadRankError(f"{where}: an index run must be a pair [start, stop); got {str(r)[:60]}")
        a = bounded(r[0], "ffn", "an index run's start", where, lo=0)
        b = bounded(r[1], "ffn", "an index run's stop", where, lo=0)
        if not at <= a < b <= features:
            raise HeadRankError(f"{where}: index run [{a}, {b}) is empty, reversed, overlaps the one before or "
                                f"leaves [0, {features})")
        at = b
    return {**spec, "features": features}


def is_factored(path: Path) -> bool:
    """``path`` is a directory holding a ``factored.json`` (a factored compress output)."""
    return path.is_dir() and ((path / MANIFEST).exists() or (path / MANIFEST).is_symlink())


class FactoredCheckpoint(Checkpoint):
    """A factored compress output seen at its uncut shapes (the module docstring): each tensor the
    manifest shrank comes back as the dense tensor of the same cut, zeros where it was dropped."""

    def __init__(self, source: Located, config: Any = None, require_config: bool = True, arrays: str = "torch"):
        self.manifest = manifest(source.path)
        super().__init__(source, config=config, require_config=require_config, arrays=arrays)
        self._shrunk: dict[str, tuple[int, Any, str]] = {}  # tensor -> (axis, kept indices, manifest entry)
        import numpy as np

        for module, spec in self.manifest.items():
            idx = np.concatenate([np.arange(a, b) for a, b in spec["index"]])
            weight = f"{module}.weight"
            if weight not in self:
                raise HeadRankError(f"{source.path / MANIFEST}: module {module!r} has no tensor {weight} in the "
                                    "weight files")
            self._shrunk[weight] = (0 if spec["keep"] == "rows" else 1, idx, module)
            if spec["keep"] == "rows" and f"{module}.bias" in self:
                self._shrunk[f"{module}.bias"] = (0, idx, module)
        for name in self._shrunk:
            self.meta(name)  # each stored shape checked against the manifest before anything is read

    def _full_shape(self, name: str, stored: tuple[int, ...]) -> tuple[int, ...]:
        axis, idx, module = self._shrunk[name]
        features = self.manifest[module]["features"]
        if len(stored) <= axis or stored[axis] != len(idx):
            raise HeadRankError(f"{self.path / MANIFEST}: tensor {name} has shape {list(stored)}, but the manifest "
                                f"keeps {len(idx):,} of its {features:,} {'rows' if axis == 0 else 'columns'}")
        return stored[:axis] + (features,) + stored[axis + 1:]

    def _read(self, name: str, p: Path) -> Any:
        t = super()._read(name, p)
        if name not in self._shrunk:
            return t
        axis, idx, _ = self._shrunk[name]
        shape = self._full_shape(name, tuple(t.shape))
        if hasattr(t, "new_zeros"):  # a torch tensor
            import torch

            out = t.new_zeros(shape)
            out.index_copy_(axis, torch.from_numpy(idx), t)
            return out
        import numpy as np

        out = np.zeros_like(t, shape=shape)  # keeps the bfloat16 mark (headrank.util.bf16)
        out[(slice(None),) * axis + (idx,)] = t
        return out

    def _meta(self, name: str, p: Path) -> TensorMeta:
        m = super()._meta(name, p)
        if name not in self._shrunk:
            return m
        return TensorMeta(m.dtype, self._full_shape(name, m.shape), m.nbytes, m.file)  # bytes: as stored
