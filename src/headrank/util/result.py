"""The one contract every verb's result keeps (``headrank.spectra``, ``collapse``, ``scale``,
``track``, ``sweep``, ``train``, ``reproduce``; ``compress`` by the same methods).

Every result has

- ``.table``: a pandas DataFrame, the verb's main table;
- ``.meta``: a dict, what was measured and how;
- ``.summary()``: a DataFrame, the short view of ``.table``;
- ``.save(out)``: the files the CLI writes with ``--out``, returned as a list of paths;
- ``ResultClass.load(out)``: the result read back from those files;
- ``.plot()``: a matplotlib Figure;
- ``.to_json()``: JSON-able data, exactly what the verb's ``--json`` prints;
- ``._repr_html_()``: a notebook view (a header line and the summary);
- ``repr(result)``: a few lines (what it is, how many rows, the headline numbers), never the
  arrays (a REPL or a log shows it whole).

The contract is documented in ``docs/python.md``; ``tests/test_contract.py`` checks it for every
verb.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, ClassVar

from headrank.errors import HeadRankError, one_line


class ResultBase:
    """The methods every verb's result shares (a mixin for the result dataclasses).

    Subclasses give ``table`` and ``meta`` (fields or properties) and implement ``summary``,
    ``save``, ``load``, ``plot`` and ``to_json``; ``_repr_html_`` comes from here.
    """

    #: the verb that makes this result (``spectra``, ``collapse`` …), shown in the notebook view
    verb: ClassVar[str] = ""

    table: Any
    meta: dict[str, Any]

    def summary(self):  # pragma: no cover - every result overrides it
        """The short view of :attr:`table` (a DataFrame)."""
        return self.table

    def save(self, out: str | os.PathLike) -> list[Path]:  # pragma: no cover - abstract
        """Write the files the CLI writes with ``--out`` into directory ``out``."""
        raise NotImplementedError

    @classmethod
    def load(cls, out: str | os.PathLike):  # pragma: no cover - abstract
        """Read a result back from the directory a :meth:`save` (or the CLI) wrote."""
        raise NotImplementedError

    def plot(self):  # pragma: no cover - abstract
        """A matplotlib Figure of the result."""
        raise NotImplementedError

    def to_json(self) -> Any:  # pragma: no cover - abstract
        """JSON-able data: what the verb's ``--json`` prints."""
        raise NotImplementedError

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # a result dataclass would get a generated __repr__ printing every array (25 KB for MiniLM):
        # one in the class's own namespace is kept by @dataclass, so put ours there
        if "__repr__" not in cls.__dict__:
            cls.__repr__ = ResultBase.__repr__

    def headline(self) -> str:
        """One line naming the result (the notebook view's header)."""
        source = self.meta.get("source") if isinstance(self.meta, dict) else None
        return f"{type(self).__name__}" + (f" of {source}" if source else "")

    def repr_lines(self) -> list[str]:
        """The lines under :meth:`headline` in ``repr(result)``: the headline numbers (subclasses
        add theirs); by default the table's size and the members to look at."""
        t = self.table
        shape = getattr(t, "shape", None)
        size = f"{shape[0]} rows x {shape[1]} columns" if shape is not None and len(shape) == 2 else "no table"
        return [f"  table: {size}; .summary(), .plot(), .save(out), .to_json()"]

    def __repr__(self) -> str:
        lines = [f"<{self.headline()}>"]
        try:
            lines += self.repr_lines()
        except Exception as e:  # noqa: BLE001 - a repr never raises
            lines.append(f"  ({type(e).__name__} while summarising)")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        from html import escape

        try:
            body = self.summary().head(40).to_html(max_cols=20, float_format=lambda x: f"{x:.4g}")
        except Exception as e:  # noqa: BLE001 - a notebook view never raises
            body = f"<pre>{escape(str(e))}</pre>"
        return f"<div><p><b>{escape(self.headline())}</b></p>{body}</div>"


def plain(payload: Any) -> Any:
    """``payload`` as JSON reads it back (numpy scalars to Python, tuples to lists, non-finite
    floats to None): the form every ``to_json`` returns, so a saved and reloaded result gives
    the same value."""
    from headrank.util.fileio import jsonable

    return json.loads(json.dumps(jsonable(payload)))


def records(frame) -> list[dict[str, Any]]:
    """A DataFrame as a list of row dicts, JSON's way (NaN as None, floats at full precision)."""
    return plain(frame.to_dict(orient="records"))


def read_csv(path: Path):
    """A CSV written by ``DataFrame.to_csv(index=False)``, floats read back bit-exact."""
    import pandas as pd

    if not path.is_file():
        raise HeadRankError(f"{path.parent} has no {path.name}: not a saved result of this kind")
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:  # an empty table (no columns) was saved
        return pd.DataFrame()


SAVED_JSON_CAP = 256 << 20  # a saved result's JSON record (meta.json, series.json) larger than this is not one


def read_json(path: Path) -> Any:
    """A JSON file of a saved result (a missing or broken file is one line)."""
    from headrank.util.fileio import read_regular

    if not os.path.lexists(path):
        raise HeadRankError(f"{path.parent} has no {path.name}: not a saved result of this kind")
    try:
        return json.loads(read_regular(path, "saved result", SAVED_JSON_CAP))  # no FIFO, no 500 MB file
    except RecursionError:
        raise HeadRankError(f"cannot read {path}: nested too deeply") from None
    except (OSError, ValueError) as e:
        raise HeadRankError(f"cannot read {path}: {one_line(e, 200)}") from None


def copy_dir(src: Path, out: str | os.PathLike) -> list[Path]:
    """A result that lives in its own directory (a run, a series, a sweep, a reproduction) saved
    elsewhere: the directory's files copied into ``out`` (nothing to do when ``out`` is it)."""
    src, dst = Path(src), Path(out)
    if dst.resolve() == src.resolve():
        return sorted(p for p in src.rglob("*") if p.is_file())
    if dst.exists() and any(dst.iterdir()):
        raise HeadRankError(f"out {dst} is not empty: save a {src.name!r} result into a new directory")
    skip = shutil.ignore_patterns(".lock", ".stage-*", ".headrank-staging-*", ".headrank-output.json")

    def ignore(d: str, names: list[str]) -> set[str]:  # never through a link (a planted one leaks its target)
        return set(skip(d, names)) | {n for n in names if os.path.islink(os.path.join(d, n))}

    shutil.copytree(src, dst, dirs_exist_ok=True, ignore=ignore)
    return sorted(p for p in dst.rglob("*") if p.is_file())


def check_dir(out: str | os.PathLike, marker: str) -> Path:
    """``out`` as a directory holding ``marker`` (the file every saved result of a kind has)."""
    p = Path(out)
    if not (p / marker).is_file():
        raise HeadRankError(f"{p} has no {marker}: not a saved result of this kind")
    return p


def negative_index(i: Any, n: Any, what: str) -> Any:
    """``i`` counted from the end when negative (``res[-1, -1, "qk"]``: the model's last layer and
    head, as Python counts); anything else as it is. Out of range is one line."""
    if hasattr(i, "__index__") and not isinstance(i, bool) and int(i) < 0 and n is not None:  # numpy ints too
        if int(i) + int(n) < 0:
            raise HeadRankError(f"{what} {int(i)} is out of range: the model has {n} {what}s")
        return int(i) + int(n)
    return i
