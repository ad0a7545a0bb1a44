"""The contract every checkpoint reader keeps.

:class:`TensorSource` is the protocol: ``keys()``, ``get(name)`` (a ``torch.Tensor``) and
``meta(name)`` (a :class:`TensorMeta`: stored dtype, shape, stored bytes, file) without reading
the tensor. :class:`BaseCheckpoint` is what every reader of this package is built on (local
files, a live model, a GGUF file, a LoRA-adapted checkpoint, a checkpoint over HTTP): it holds
what a reader resolved at construction (``source``, ``path``, ``config``, ``config_path`` and the
tensor entries by name) and gives the mapping helpers (``in``, iteration, ``dtype``, the
context manager) once. A reader passes all of it to ``BaseCheckpoint.__init__`` and implements
``_read`` and ``_meta`` for one entry; nothing sets another class's fields.

``BaseCheckpoint`` also applies the scheme layer (:mod:`headrank.io.schemes`): where config.json
names a ``quantization_config``, ``keys``, ``get`` and ``meta`` give the dequantized weights
(float64) under their own names, their scales hidden, whatever reader holds the bytes; a
method that is not read is refused on first access. ``quantization`` says which (meta.json).

Every reader of local files records each file it opens in ``stamps`` (:mod:`headrank.io.identity`):
:meth:`BaseCheckpoint.check_unchanged` after the last read (a file truncated, rewritten or
replaced by rename meanwhile is one line) and :meth:`BaseCheckpoint.identity`, what a re-run
compares before it reuses a table.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from headrank.errors import HeadRankError
from headrank.io.identity import Stamps

if TYPE_CHECKING:  # torch is imported only where a torch object is made (spectra reads through numpy)
    import torch

# safetensors' dtype names (local and remote headers) -> the dtype's name (torch's spelling) and
# its bytes per element: what a header says without importing torch
ST_NAMES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
            "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
            "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "C64": "complex64"}
ST_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
               "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "C64": 8}


def __getattr__(name: str) -> Any:
    """``ST_DTYPES`` (safetensors' dtype names -> torch dtypes), built on first use: importing this
    module does not import torch."""
    if name == "ST_DTYPES":
        import torch

        table = {code: getattr(torch, n) for code, n in ST_NAMES.items()}
        globals()["ST_DTYPES"] = table
        return table
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class TensorMeta:
    """What a reader knows of one tensor without reading its data."""

    dtype: str  # as stored: "bfloat16", a GGML type ("Q8_0"), "float64 (adapted)"
    shape: tuple[int, ...]  # of the tensor ``get`` returns
    nbytes: int | None  # bytes it occupies where it is stored; None: computed, not stored
    file: str | None  # name (or URL) of the file that holds it; None: in memory


@runtime_checkable
class TensorSource(Protocol):
    """Tensors by name: what the layout table reads (every reader here implements it)."""

    def keys(self) -> list[str]: ...

    def get(self, name: str) -> torch.Tensor: ...

    def meta(self, name: str) -> TensorMeta: ...


class BaseCheckpoint:
    """A :class:`TensorSource` with the config beside it and where both came from.

    ``entries``: the reader's tensor entries by name (whatever its ``_read``/``_meta`` need);
    ``source``: what the user named; ``path``: the file, directory or URL read (a label for a
    model in memory); ``config``: the config.json dict; ``config_path``: where it came from.
    """

    #: False for a reader that reads another reader's tensors (an adapter over its base): the scheme
    #: layer is applied once, by the reader of the stored tensors
    stored_tensors = True
    #: a tensor that a scheme dequantizes comes back as numpy float64 (True) or torch float64
    _numpy_out = False

    def __init__(self, entries: Mapping[str, Any], *, source: str, path: Path | str, config: Mapping[str, Any],
                 config_path: Path | str):
        self.source = source
        self.path = path
        self.config: dict[str, Any] = dict(config)
        self.config_path = config_path
        self._entries = entries
        if self.stamps.root is None:
            self.stamps.root = path
        self._view_built = False
        self._view: Any = None

    # -- what a reader implements --------------------------------------------------------------
    def _read(self, name: str, entry: Any) -> torch.Tensor:
        raise NotImplementedError

    def _meta(self, name: str, entry: Any) -> TensorMeta:
        raise NotImplementedError

    def _read_stored(self, names: list[str]) -> dict[str, Any]:
        """Stored tensors by name, as stored (a remote reader fetches them concurrently)."""
        return {n: self._read(n, self._entry(n)) for n in names}

    # -- the scheme layer ------------------------------------------------------------------------
    def scheme_view(self) -> Any:
        """The :class:`headrank.io.schemes.View` of a quantized checkpoint, None otherwise; built
        on first use (a method that is not read is refused here)."""
        if not self._view_built:
            view = None
            if self.stored_tensors and self.config and (
                    "quantization_config" in self.config or "compression_config" in self.config):
                from headrank.io.schemes import View, scheme_for

                scheme = scheme_for(self.config, self.config_path)
                view = View(self, scheme) if scheme is not None else None
            self._view, self._view_built = view, True
        return self._view

    @property
    def quantization(self) -> dict[str, Any] | None:
        """What the scheme layer did (meta.json's ``quantization``), None for plain weights."""
        view = self.scheme_view()
        return view.record() if view is not None else None

    # -- the protocol ----------------------------------------------------------------------------
    def keys(self) -> list[str]:
        view = self.scheme_view()
        return list(self._entries) if view is None else list(view.keys)

    def get(self, name: str) -> torch.Tensor:
        """One tensor (its stored dtype unless the reader says otherwise; a quantized weight
        dequantized, in float64)."""
        view = self.scheme_view()
        if view is None:
            return self._read(name, self._entry(name))
        return self.get_many({name: name}, attention=False)[name]

    def get_many(self, names: Mapping[str, str], *, attention: bool = True) -> dict[str, Any]:
        """Several tensors (``{role: name}``, one layer's attention tensors unless ``attention`` is
        False), their stored parts read together; attention tensors are checked against the
        quantization config (:meth:`check_attention`)."""
        view = self.scheme_view()
        if view is None:
            if type(self)._read_stored is BaseCheckpoint._read_stored:  # one at a time, each through ``get``
                return {role: self.get(n) for role, n in names.items()}
            stored = self._read_stored(list(dict.fromkeys(names.values())))
            return {role: stored[n] for role, n in names.items()}
        if attention:
            self.check_attention(names)
        parts = {n: view.stored_parts(self._check_name(n)) for n in dict.fromkeys(names.values())}
        stored = self._read_stored(list(dict.fromkeys(p for ps in parts.values() for p in ps)))
        built = {n: view.build(n, stored, self._numpy_out) for n in parts}
        return {role: built[n] for role, n in names.items()}

    def meta(self, name: str) -> TensorMeta:
        view = self.scheme_view()
        m = view.meta(self._check_name(name)) if view is not None else None
        return m if m is not None else self._meta(name, self._entry(name))

    def check_attention(self, names: Mapping[str, str]) -> None:
        """Under a quantization config, refuse attention tensors (``{role: name}``) stored plain that
        the config does not exclude: the config contradicts them (:mod:`headrank.io.schemes`)."""
        view = self.scheme_view()
        if view is not None:
            view.check_attention(list(names.values()))

    def _check_name(self, name: str) -> str:
        view = self.scheme_view()
        if view is not None and not view.has(name):
            raise HeadRankError(f"tensor {name!r} not found in {self.path}"
                                + (" (it is a quantization scale, read with its weight)" if view.is_hidden(name)
                                   else ""))
        return name

    def _entry(self, name: str) -> Any:
        try:
            return self._entries[name]
        except KeyError:
            raise HeadRankError(f"tensor {name!r} not found in {self.path}") from None

    # -- helpers, the same for every reader ------------------------------------------------------
    def __contains__(self, name: object) -> bool:
        view = self.scheme_view()
        return name in self._entries if view is None else isinstance(name, str) and view.has(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def dtype(self, name: str) -> str:
        """The stored dtype of ``name`` (meta.json's ``dtypes``)."""
        return self.meta(name).dtype

    def release(self) -> None:
        """Unmap what reads mapped so far (a streaming reader calls this between layers)."""

    @property
    def files(self) -> list[Any]:
        """The weight files read (empty for a model in memory)."""
        return []

    @property
    def stamps(self) -> Stamps:
        """The local files this reader opened, each with its identity at open (none for a model in
        memory or a remote checkpoint, whose commit pins it)."""
        s = self.__dict__.get("_stamps")
        if s is None:
            s = self.__dict__["_stamps"] = Stamps()
        return s

    def check_unchanged(self) -> None:
        """After the last read: one line if a file read changed since it was opened (:mod:`headrank.io.identity`)."""
        self.stamps.check()

    def identity(self) -> str | None:
        """The fingerprint of the local files read (:meth:`headrank.io.identity.Stamps.fingerprint`);
        None when there are none."""
        return self.stamps.fingerprint() if self.stamps else None

    def close(self) -> None:
        """Let go of open files."""

    def __enter__(self) -> BaseCheckpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.source!r}, {len(self._entries)} tensors)"
