"""One door for every kind of source: whatever the user holds → an :class:`AttentionReader`
whose ``origin`` says what it was (for meta.json).

Sources (:func:`open_reader`):

- a live ``nn.Module`` (a Hugging Face ``PreTrainedModel``: its config gives the layout; the
  project's models; any module with ``layout=``) or a ``state_dict`` with ``config=``/``layout=``;
- a reader of this package (any :class:`~headrank.io.tensor_source.BaseCheckpoint`: a
  :class:`~headrank.io.checkpoint.Checkpoint`, a GGUF, live, adapted or remote one);
- ``minilm`` (shipped), a checkpoint directory, a single weights file (``config=``), a training
  run directory or a Trainer ``output_dir`` / ``checkpoint-N`` (weights chosen by Hugging Face's
  file names, optimizer and RNG states ignored);
- a Hugging Face Hub id in the local cache (``revision=``; ``download=True`` fetches config and
  weights where the network is allowed);
- a ``.gguf`` file (llama.cpp, Ollama), sizes from its own metadata;
- with ``remote=True`` a Hub id, and always an ``http(s)://`` URL (a checkpoint directory, a
  ``.safetensors`` or a ``.gguf`` file), read over HTTP range requests: config, index, headers,
  then only the tensors the reader asks for (:mod:`headrank.io.remote`);
- a factored ``compress`` output (``factored.json``), read at its uncut shapes
  (:mod:`headrank.io.factored`);
- a PEFT LoRA adapter directory, merged onto ``base=`` (default: the adapter's
  ``base_model_name_or_path``); ``delta=True`` analyses the change of the products.

``fold_norm=True`` folds the pre-attention norm gain into W_Q, W_K, W_V (TransformerLens' fold_ln
alone); ``convention="transformerlens"`` reads the weights as TransformerLens 4 holds them by
default (:mod:`headrank.io.convention`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from headrank.errors import HeadRankError
from headrank.io.checkpoint import SHIPPED, Checkpoint, Located, locate
from headrank.io.convention import convention as check_convention
from headrank.io.layout_toml import layout_from_toml
from headrank.io.layouts import AttentionReader, Layout
from headrank.io.tensor_source import BaseCheckpoint


def open_reader(source: Any, *, config: str | os.PathLike | dict[str, Any] | None = None,
                layout: str | os.PathLike | Layout | None = None, revision: str | None = None,
                base: str | os.PathLike | None = None, delta: bool = False, fold_norm: bool = False,
                download: bool = False, remote: bool = False, allow_full: bool = False,
                arrays: str = "torch", convention: str | None = None) -> AttentionReader:
    """An :class:`AttentionReader` over ``source`` (see the module docstring); its ``origin``
    dict holds ``input`` (the kind of source), ``source``, ``path``, ``files`` and details.
    ``remote``: read a Hub id over HTTP ranges (:mod:`headrank.io.remote`; an ``http(s)://``
    source always is); ``allow_full``: accept a server that ignores ranges (whole files).
    ``arrays="numpy"``: a local checkpoint's safetensors tensors as numpy arrays, read without
    torch (:class:`~headrank.io.checkpoint.Checkpoint`); other sources give torch tensors."""
    _check_options(config=config, layout=layout, revision=revision, base=base)
    check_convention(convention)  # an unknown name fails before anything is opened
    return _open(source, config=config, layout=layout, revision=revision, base=base, delta=delta, fold_norm=fold_norm,
                 download=download, remote=remote, allow_full=allow_full, arrays=arrays).apply_convention(convention)


def _open(source: Any, *, config: Any, layout: Any, revision: str | None, base: Any, delta: bool, fold_norm: bool,
          download: bool, remote: bool, allow_full: bool, arrays: str) -> AttentionReader:
    if layout is not None and not isinstance(layout, Layout):
        layout = layout_from_toml(layout)
    if remote or allow_full or _is_url(source):
        return _open_remote(source, config=config, layout=layout, revision=revision, base=base, delta=delta,
                            fold_norm=fold_norm, download=download, allow_full=allow_full, remote=remote)
    if isinstance(source, (str, os.PathLike)):
        return _open_path(source, config=config, layout=layout, revision=revision, base=base, delta=delta,
                          fold_norm=fold_norm, download=download, arrays=arrays)
    if base is not None or delta:
        raise HeadRankError(_NOT_ADAPTER)
    if isinstance(source, BaseCheckpoint):
        ckpt, origin = source, _origin("checkpoint", source)
    else:
        from headrank.io.live import transformer_lens_view  # TransformerLens models: what to read

        source, config, layout, tl = transformer_lens_view(source, config, layout)
        ckpt, origin = _open_live(source, config, layout)
        origin.update(tl)
    if revision is not None:
        raise HeadRankError("`revision` applies to a Hugging Face Hub id")
    return AttentionReader(ckpt, layout, fold_norm=fold_norm, origin=origin)


_NOT_ADAPTER = "`base` and `delta` apply to a LoRA adapter directory (adapter_config.json)"


def _is_url(source: Any) -> bool:
    """headrank.io.remote.is_url, without importing that module (it imports torch)."""
    return isinstance(source, str) and source[:8].lower().startswith(("http://", "https://"))


def _open_remote(source: Any, *, config: Any, layout: Layout | None, revision: str | None, base: Any,
                 delta: bool, fold_norm: bool, download: bool, allow_full: bool, remote: bool) -> AttentionReader:
    """A Hub id or an http(s) URL read over HTTP range requests (:mod:`headrank.io.remote`)."""
    from headrank.io.remote import is_url, open_remote

    if not isinstance(source, str):
        raise HeadRankError("`remote` reads a Hugging Face Hub id or an http(s) URL, not a "
                            f"{type(source).__name__}")
    if download:
        raise HeadRankError("`download` and `remote` exclude each other: `remote` reads without downloading")
    if base is not None or delta:
        raise HeadRankError("`base` and `delta` apply to a local LoRA adapter directory, not to `remote`")
    if not is_url(source) and (source in SHIPPED or Path(source).exists()):
        what = "`remote`" if remote else "`allow_full` (a remote read's option)"
        raise HeadRankError(f"{what} reads a Hub id or an http(s) URL; {source} is a local path")
    ckpt, origin, own_layout = open_remote(source, revision=revision, allow_full=allow_full, config=config)
    return AttentionReader(ckpt, layout or own_layout, fold_norm=fold_norm, origin=origin)


def _check_options(*, config: Any, layout: Any, revision: Any, base: Any) -> None:
    """Types of the options (an API caller may pass anything): one line for a wrong one."""
    path_like = (str, os.PathLike)
    for name, value, ok, want in (
            ("config", config, (*path_like, dict), "a path or a dict"),
            ("layout", layout, (*path_like, Layout), "a path to a TOML file or a Layout"),
            ("revision", revision, (str,), "a string"),
            ("base", base, path_like, "a path or a Hub id")):
        if value is not None and (isinstance(value, bytes) or not isinstance(value, ok) or value == ""):
            raise HeadRankError(f"{name} must be {want}; got {type(value).__name__} {str(value)[:40]!r}")


def _open_live(obj: Any, config: Any, layout: Layout | None) -> tuple[BaseCheckpoint, dict[str, Any]]:
    import torch.nn as nn

    from headrank.io.live import LiveCheckpoint

    if not isinstance(obj, (nn.Module, Mapping)):
        raise HeadRankError(f"cannot analyse a {type(obj).__module__}.{type(obj).__qualname__}: pass a path, a "
                            "Hub id, a GGUF file, an nn.Module or a state_dict (name -> tensor)")
    ckpt = LiveCheckpoint(obj, config, require_config=layout is None)
    if layout is None and not ckpt.config.get("model_type"):
        raise HeadRankError(f"{type(obj).__name__}: its config has no model_type; pass config= or layout=")
    origin = {"input": ckpt.kind, "source": ckpt.source, "path": None, "files": [],
              "live": {"class": f"{type(obj).__module__}.{type(obj).__qualname__}",
                       "note": "read from memory (parameters and buffers), nothing on disk"}}
    return ckpt, origin


def _open_path(source: str | os.PathLike, *, config: Any, layout: Layout | None, revision: str | None,
               base: Any, delta: bool, fold_norm: bool, download: bool, arrays: str = "torch") -> AttentionReader:
    from headrank.io import hub

    loc = locate(source, revision, download=download)  # resolved once; the readers take what it found
    # io.adapters.is_adapter_dir, without importing io.adapters (torch) for a plain checkpoint
    adapter = loc.given.is_dir() and (loc.given / "adapter_config.json").is_file()
    if (base is not None or delta) and not adapter:
        raise HeadRankError(_NOT_ADAPTER)
    extra: dict[str, Any] = {}
    if loc.hub:
        extra["hub"] = {"repo_id": loc.source, "revision": revision or "main", "commit": loc.given.name,
                        "cache": str(hub.cache_dir())}
    if adapter:
        return _open_adapter(loc, base, delta=delta, layout=layout, fold_norm=fold_norm, extra=extra)
    gguf_file = _gguf_in(loc.given)
    if gguf_file is not None:
        from headrank.io.gguf import GGUFCheckpoint, gguf_origin

        g = GGUFCheckpoint(gguf_file, label=loc.source)
        origin = {**_origin(loc.kind, g), **extra, **gguf_origin(g)}
        return AttentionReader(g, layout or g.layout, fold_norm=fold_norm, origin=origin)
    if loc.resolved_from is not None:
        extra["resolved_from"] = str(loc.resolved_from.resolve())
    from headrank.io.factored import FactoredCheckpoint, is_factored

    factored = is_factored(loc.path)
    cls = FactoredCheckpoint if factored else Checkpoint
    ckpt = cls(loc, config=config, require_config=layout is None, arrays=arrays)
    origin = {**_origin(loc.kind, ckpt), **extra}
    if factored:
        origin["factored"] = {"modules": len(ckpt.manifest), "note": "a factored compress output (factored.json): "
                              "each shrunk projection read at its uncut shape, zeros where the cut dropped it"}
    if loc.kind == "trainer":
        origin["ignored_files"] = sorted(p.name for p in loc.path.iterdir() if p.is_file() and p not in ckpt.files
                                         and p.suffix in (".pt", ".pth", ".bin"))
    return AttentionReader(ckpt, layout, fold_norm=fold_norm, origin=origin)


def _open_adapter(loc: Located, base: Any, *, delta: bool, layout: Layout | None, fold_norm: bool,
                  extra: dict[str, Any]) -> AttentionReader:
    from headrank.io.adapters import (
        AdaptedCheckpoint,
        DeltaReader,
        adapter_origin,
        read_adapter_config,
    )

    cfg = read_adapter_config(loc.given)
    base = base if base is not None else cfg.get("base_model_name_or_path")
    if not base:
        raise HeadRankError(f"{loc.given}: the adapter names no base model; pass `base` PATH|ID")
    ckpt = AdaptedCheckpoint(loc.given, Checkpoint(locate(base), require_config=layout is None))
    origin = {**_origin("adapter", ckpt, loc.source), **extra, **adapter_origin(ckpt, delta)}
    origin["path"] = str(loc.given.resolve())
    cls = DeltaReader if delta else AttentionReader
    return cls(ckpt, layout, fold_norm=fold_norm, origin=origin)


def _gguf_in(path: Path) -> Path | None:
    """``path`` itself if it is a GGUF file; the one ``*.gguf`` of a directory without config.json."""
    if path.is_file() and path.suffix != ".safetensors":  # (io.gguf imports torch: not for safetensors)
        from headrank.io.gguf import is_gguf

        return path if is_gguf(path) else None
    if path.is_dir() and not (path / "config.json").exists():
        found = sorted(path.glob("*.gguf"))
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise HeadRankError(f"{path} holds {len(found)} .gguf files: name one")
    return None


def _origin(kind: str, ckpt: BaseCheckpoint, source: str | None = None) -> dict[str, Any]:
    path = getattr(ckpt, "path", None)
    out = {"input": kind, "source": source if source is not None else ckpt.source,
           "path": str(Path(path).resolve()) if path is not None and kind not in ("live", "state_dict") else None,
           "files": [p.name for p in ckpt.files]}
    quant = getattr(ckpt, "base", ckpt).quantization  # the scheme layer (io.schemes): what was dequantized
    if quant is not None:
        out["quantization"] = quant
    return out
