"""The reproductions' vocabulary: :class:`Claim`, :class:`FigureOut`, :class:`Result`, and the
registry of studies by name (``attnrank reproduce --list`` reads :data:`CATALOGUE` without
importing any study)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from attnrank.errors import AttnRankError
from attnrank.util.fileio import jsonable

# name → (module that registers it, one-line title). Imported lazily by get().
CATALOGUE: dict[str, tuple[str, str]] = {
    "fig1": ("attnrank.studies.toys", "Figure 1 + Proposition 3.1: gradient descent on 5x5 factors; "
                              "L2 on factors becomes nuclear norm on the product"),
    "fig5": ("attnrank.studies.toys", "Figure 5: 2-D toy, AdamW vs Adam+L2, direct (L2 optimum) and "
                              "factorized w = a*b (L1 optimum)"),
    "collapse": ("attnrank.studies.collapse", "Rank collapse: pure attention loses rank doubly exponentially with depth; "
                                      "skips prevent it, MLPs slow it (MiniLM surgery, depth sweep, paths)"),
    "fig4": ("attnrank.studies.fig4", "Figure 4: balance of a pretrained model's attention factors (row norms, "
                                       "Frobenius bound vs nuclear norm), MiniLM-L6 in place of LLaMA-2 7B"),
    "fig2": ("attnrank.studies.fig2", "Figure 2: 2-layer transformer on associative recall; attention weight decay "
                                     "lowers the rank of P W_V, balances the factors, closes the nuclear-norm gap"),
    "fig3": ("attnrank.studies.lm", "Figure 3: rank of W_K^T W_Q and P W_V against attention weight decay; byte-level LM "
                                  "(middle layer, per head) and ViT on digits (all heads and layers)"),
    "table1": ("attnrank.studies.lm", "Table 1: LM test perplexity over attention decay x MLP decay (mean +- std over "
                                    "seeds); does attention decay hurt, does decoupling help"),
    "scale": ("attnrank.studies.scale", "Scale invariance and weight decay: ReLU+LayerNorm MLPs on digits (no residual, post-norm, pre-norm); effective learning rate, angular update, equilibrium norm"),
}


@dataclass
class Claim:
    """One checked claim. ``held`` is the verdict; ``measured``/``expected`` carry numbers.

    ``measured`` and ``expected`` may be numbers, strings, lists or dicts (JSON-serialisable);
    ``tolerance`` says how close counts as agreement; ``detail`` says how it was measured
    and anything a reader needs to judge it.
    """

    name: str
    source: str
    statement: str
    measured: Any
    expected: Any
    held: bool
    tolerance: Any = None
    detail: str = ""

    def __post_init__(self) -> None:
        self.held = bool(self.held)

    def to_json(self) -> dict[str, Any]:
        return jsonable(asdict(self))


@dataclass
class FigureOut:
    """A matplotlib figure with a file stem and a caption."""

    name: str
    figure: Any
    caption: str = ""


@dataclass
class Result:
    """What a reproduction returns."""

    claims: list[Claim]
    figures: list[FigureOut] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Entry:
    name: str
    title: str
    source: str
    fn: Callable[..., Result]


_REGISTRY: dict[str, Entry] = {}


def register(name: str, *, title: str, source: str) -> Callable[[Callable[..., Result]], Callable[..., Result]]:
    """Decorator: register ``fn(quick: bool = False) -> Result`` as reproduction ``name``."""

    def deco(fn: Callable[..., Result]) -> Callable[..., Result]:
        prev = _REGISTRY.get(name)
        if prev is not None and prev.fn.__module__ != fn.__module__:
            raise ValueError(f"reproduction {name!r} registered twice ({prev.fn.__module__}, {fn.__module__})")
        _REGISTRY[name] = Entry(name=name, title=title, source=source, fn=fn)
        return fn

    return deco


def names() -> list[str]:
    """Every known reproduction: the catalogue plus anything registered at run time."""
    return sorted(set(CATALOGUE) | set(_REGISTRY))


def listing() -> list[tuple[str, str]]:
    """(name, title) for every known reproduction, without importing their modules."""
    out = []
    for n in names():
        if n in _REGISTRY:
            out.append((n, _REGISTRY[n].title))
        else:
            out.append((n, CATALOGUE[n][1]))
    return out


def get(name: str) -> Entry:
    """The registered entry for ``name``, importing its module if needed."""
    if name not in _REGISTRY and name in CATALOGUE:
        importlib.import_module(CATALOGUE[name][0])
    if name not in _REGISTRY:
        known = ", ".join(names()) or "(none)"
        raise AttnRankError(f"unknown reproduction {name!r}; known: {known} (see `attnrank reproduce --list`)")
    return _REGISTRY[name]
