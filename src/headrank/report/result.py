"""``headrank.reproduce``: a reproduction (or all of them) as a function, and its result."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from headrank.errors import HeadRankError
from headrank.util.result import ResultBase, check_dir, copy_dir, plain, read_json

#: the claim fields shown in :meth:`ReproduceResult.summary` (the rest stay in ``table``)
SUMMARY_COLUMNS = ("reproduction", "name", "kind", "verdict", "key", "expected")


@dataclass
class ReproduceResult(ResultBase):
    """One reproduction's (or ``all``'s) verdicts, read from its output directory.

    ``table``: one row per claim (name, kind, verdict, measured, expected, key, rule …;
    ``claims.json``); ``meta``: ``run.json`` (one reproduction) or ``summary.json`` (``all``);
    ``summary()``: the claims' verdicts in short.
    """

    verb = "reproduce"

    out: Path
    name: str
    claims: list[dict[str, Any]]
    meta: dict[str, Any]

    @property
    def table(self) -> pd.DataFrame:
        return pd.DataFrame(self.claims)

    @property
    def all_held(self) -> bool:
        """Whether every claim held."""
        return all(c.get("held") for c in self.claims)

    def headline(self) -> str:
        held = sum(bool(c.get("held")) for c in self.claims)
        return f"reproduce {self.name} in {self.out}: {held} of {len(self.claims)} claims held"

    def summary(self) -> pd.DataFrame:
        t = self.table
        return t[[c for c in SUMMARY_COLUMNS if c in t]] if len(t) else t

    def save(self, out: str | os.PathLike) -> list[Path]:
        """The report directory (report.html, claims.json, data.json, run.json, PNGs) copied into ``out``."""
        return copy_dir(self.out, out)

    @classmethod
    def load(cls, out: str | os.PathLike) -> ReproduceResult:
        """The reproduction a :func:`reproduce` (or ``headrank reproduce --out``) wrote into ``out``."""
        p = Path(out)
        if (p / "summary.json").is_file() and not (p / "run.json").is_file():
            return cls(out=p, name="all", claims=read_json(p / "claims.json"), meta=read_json(p / "summary.json"))
        p = check_dir(p, "run.json")
        meta = read_json(p / "run.json")
        return cls(out=p, name=str(meta.get("name")), claims=read_json(p / "claims.json"), meta=meta)

    def plot(self):
        """Claims per verdict (per reproduction for ``all``) as stacked bars."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        t = self.table
        key = "reproduction" if "reproduction" in t else None
        counts = (t.groupby([key, "verdict"]).size().unstack(fill_value=0) if key
                  else t.groupby("verdict").size().to_frame(self.name).T)
        fig, ax = plt.subplots(figsize=(max(4.0, 0.6 * len(counts) + 2), 3.2))
        counts.plot.bar(stacked=True, ax=ax, color={"held": "#2a7", "not held": "#c33", "inconclusive": "#bbb"})
        ax.set_ylabel("claims")
        ax.set_title(self.headline(), fontsize=9)
        fig.tight_layout()
        return fig

    def to_json(self) -> Any:
        """What ``headrank reproduce --json`` prints: for one reproduction ``name``, ``out``,
        ``runtime_s`` and ``claims``; for ``all`` the combined ``summary.json``."""
        if self.name == "all":
            return plain(self.meta)
        return plain({"name": self.name, "out": str(self.out), "runtime_s": self.meta.get("runtime_s"),
                      "claims": self.claims})


def reproduce(name: str, out: str | os.PathLike | None = None, *, profile: str = "full", model: str | None = None,
              replot: bool = False, force: bool = False) -> ReproduceResult:
    """``headrank reproduce NAME``: run (or re-judge) a reproduction of the source documents and
    write its report (``docs/verbs/reproduce.md``).

    Parameters
    ----------
    name
        A reproduction (``headrank reproduce --list``: ``fig1`` … ``table1``) or ``"all"``.
    out
        Output directory (default ``out/NAME``): report.html, claims.json, data.json, run.json, PNGs.
    profile
        One of the profiles the study offers: ``"quick"``, ``"full"`` (default), and
        ``"paper"`` where the study has it (``all``: quick or full).
    model
        Run the reproduction's analysis on this checkpoint instead of its default (e.g. fig4).
    replot
        Run nothing: re-judge the claims and redraw the figures from a finished run in ``out``.
    force
        With ``"all"``: recompute parts already finished in ``out``.

    Returns
    -------
    ReproduceResult
    """
    from headrank.report import runner
    from headrank.studies import registry

    if not isinstance(name, str) or not name:
        raise HeadRankError("`name` must be a reproduction's name or 'all'")
    if name == "all" and model is not None:
        raise HeadRankError("`model` applies to one reproduction (e.g. fig4), not to 'all'")
    out = Path(out) if out is not None else Path("out") / name
    if name == "all":
        if profile not in ("quick", "full"):
            raise HeadRankError(f"`profile` of 'all' must be quick or full; got {str(profile)[:40]!r}")
        runner.run_all(out, quick=profile == "quick", force=force, replot=replot)
        return ReproduceResult.load(out)
    study = registry.get(name).study
    if not replot:
        study.make_params(profile)  # an unknown profile fails here, before any work
    runner.run(name, out, profile=profile, replot=replot, overrides={"model": model} if model is not None else None)
    return ReproduceResult.load(out)
