"""What :func:`headrank.compress.compress` returns: ``compress.json`` as a mapping, with
the result methods every headrank result has (``table``, ``meta``, ``summary()``, ``save()``,
``load()``, ``plot()``, ``to_json()``, a notebook view)."""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import Any

from headrank.errors import HeadRankError

FILE = "compress.json"


class CompressResult(dict):
    """``compress.json``: ``units`` (one row per cut unit), ``totals``, ``rule``, ``products``,
    ``checkpoint`` (format, bytes), ``eval`` (with ``--eval``) and conventions. Indexing works as
    on the dict it was; the methods below give the common result views."""

    @property
    def table(self):
        """One row per (layer, kv head, product): k, kept energy, errors, parameters saved."""
        import pandas as pd

        return pd.DataFrame(self.get("units", []))

    @property
    def meta(self) -> dict[str, Any]:
        """Everything but the per-unit rows."""
        return {k: v for k, v in self.items() if k != "units"}

    def summary(self):
        """Per (layer, product): mean k, mean kept energy, mean relative error, parameters saved."""
        t = self.table
        if t.empty:
            return t
        return (t.groupby(["layer", "product"], sort=True)
                .agg(k=("k", "mean"), kept_energy=("kept_energy", "mean"), frob_rel_error=("frob_rel_error", "mean"),
                     params_saved=("params_saved", "sum"))
                .reset_index())

    def to_json(self) -> dict[str, Any]:
        """What ``headrank compress --json`` prints: the rule, products, notes, totals, checkpoint
        bytes, files and eval of compress.json (not its per-unit rows)."""
        from headrank.compress.report import json_view

        return json.loads(json.dumps(json_view(self)))

    def save(self, out: str | os.PathLike) -> list[Path]:
        """Write ``compress.json`` into directory ``out`` (created; through the writer); the path written."""
        from headrank.io.writer import save_set
        from headrank.util.fileio import write_json

        return save_set(out, lambda stage: [write_json(stage / FILE, dict(self))], owns=FILE)

    @classmethod
    def load(cls, out: str | os.PathLike) -> CompressResult:
        """The result saved in ``out`` (a compress output directory or its compress.json)."""
        p = Path(out)
        p = p / FILE if p.is_dir() else p
        from headrank.io.validate import read_json

        if not p.exists() and not p.is_symlink():
            raise HeadRankError(f"{p}: no such file (not a compress output)")
        data = read_json(p, "compress record")  # a FIFO or a 500 MB file: one line
        if not isinstance(data, dict) or "totals" not in data:
            raise HeadRankError(f"{p}: not a compress.json")
        return cls(data)

    def plot(self, path: str | os.PathLike | None = None):
        """Mean k per layer for each product cut (of the head dimension); returns the Figure
        (with ``path``, also writes a PNG there)."""
        import matplotlib

        if path is not None:
            matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        s = self.summary()
        fig, ax = plt.subplots(figsize=(6, 3.2))
        for p in self.get("products", []):
            part = s[s["product"] == p]
            ax.plot(part["layer"], part["k"], "o-", label=p.upper())
        ax.axhline(self["config"]["head_dim"], color="grey", lw=0.8, ls=":", label="head dim")
        ax.set_xlabel("layer")
        ax.set_ylabel("mean rank kept")
        ax.set_title(f"compress: {self['rule']['kind']} {self['rule']['value']:g}", fontsize=10)
        ax.legend(fontsize=8)
        fig.tight_layout()
        if path is not None:
            fig.savefig(path, dpi=110)
        return fig

    def lines(self) -> list[str]:
        """The console report (totals, checkpoint bytes, eval)."""
        from headrank.compress.report import report_lines

        return report_lines(self)

    def _repr_html_(self) -> str:
        """The console report's lines, then the per-(layer, product) summary table."""
        rows = "".join(f"<li>{html.escape(line)}</li>" for line in self.lines())
        table = self.summary().head(40).to_html(float_format=lambda x: f"{x:.4g}")
        return f"<div><b>headrank compress</b><ul>{rows}</ul>{table}</div>"

    def __repr__(self) -> str:
        return "CompressResult(" + "; ".join(self.lines()) + ")"
