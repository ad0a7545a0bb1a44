"""One declaration per parameter: each verb's table of the options it bounds (type, bounds or
choices, command-line flag, the message), and the one validator that both the command line and
the Python function of the verb call (docs/python.md).

A :class:`Param` says what a value must be; :meth:`Param.check` returns it checked or raises
:class:`~headrank.errors.HeadRankError` with one line naming the parameter in backticks (the
command line turns `` `n_eval` `` into ``--eval-n``: :func:`headrank.cli.common.flag_message`).
The typer annotations of the commands take their flag and the bounds shown in ``--help`` from
here (:func:`headrank.cli.common.option`) and write no ``min=``/``max=`` of their own, so the two
cannot disagree (tests/util/test_constraints.py). A bound that depends on the data (a layer
index below the model's depth, a rank at most the head dimension) is checked where the data is
read; a parameter with a syntax of its own (``layers``' ``0,2,5-7``, ``energy``'s levels,
``convention``'s aliases) is parsed by its parser.
"""

from __future__ import annotations

import itertools
import math
import numbers
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from headrank.errors import HeadRankError

PER_CPU = 4  # oversubscription allowed: a test asking for 2 workers still runs on a 1-CPU machine


def cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - no affinity on this platform
        return os.cpu_count() or 1


def max_threads() -> int:
    """The most threads or worker processes a command may ask for: :data:`PER_CPU` per CPU.
    More would only slow everything down, and a million threads crash OpenBLAS's thread
    creation (SIGSEGV) instead of failing."""
    return PER_CPU * cpus()


def _shown(value: Any) -> str:
    s = repr(value)
    return s if len(s) <= 40 else s[:37] + "..."


def _float(value: numbers.Real) -> float:
    try:
        return float(value)
    except OverflowError:  # an integer past float's range (10**400): out of any bound
        return math.inf if value > 0 else -math.inf


@dataclass(frozen=True)
class Param:
    """One parameter: ``kind`` ``int``, ``float``, ``choice`` or ``pattern``; ``low``/``high``
    (a callable for a bound known only at run time) with ``open_low``/``open_high`` for a
    float's open ends; ``choices``; ``pattern`` (a full match) described by ``text``;
    ``note``: why the bound is what it is, said after it; ``flag``: the long flag (default
    ``--`` + the name with dashes); ``api``: False for an option only the command line has;
    ``cli``: False for a parameter only the Python function takes (a config field without a
    flag); ``optional``: None stands for the default."""

    name: str
    kind: str
    low: float | None = None
    high: float | Callable[[], float] | None = None
    open_low: bool = False
    open_high: bool = False
    choices: tuple[str, ...] = ()
    pattern: str | None = None
    text: str = ""
    note: str = ""
    help_high: str = ""
    flag: str = ""
    api: bool = True
    cli: bool = True
    optional: bool = True

    @property
    def long(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    def upper(self) -> float | None:
        return self.high() if callable(self.high) else self.high

    def bounds(self, for_help: bool = False) -> str:
        """``1..16``, ``>= 2``, ``(0, 1]``, ``factored, dense``: what :meth:`check` accepts."""
        if self.kind == "choice":
            return ", ".join(self.choices)
        if self.kind == "pattern":
            return self.text
        high = self.help_high if for_help and self.help_high else self.upper()
        if self.kind == "int":
            return f"{self.low:g}..{high}" if high is not None else f">= {self.low:g}"
        if high is None:
            return f"{'>' if self.open_low else '>='} {self.low:g}"
        return f"{'(' if self.open_low else '['}{self.low:g}, {high:g}{')' if self.open_high else ']'}"

    def check(self, value: Any) -> Any:
        """``value`` checked (an int as int, a float as float), or one line; None passes (the
        parameter's default)."""
        if value is None and self.optional:
            return None
        if self.kind == "choice":
            if not isinstance(value, str) or value not in self.choices:
                raise HeadRankError(f"`{self.name}` must be one of {self.bounds()}; got {_shown(value)}")
            return value
        if self.kind == "pattern":
            if not isinstance(value, str) or not re.fullmatch(self.pattern or "", value):
                raise HeadRankError(f"`{self.name}` must be {self.text}; got {_shown(value)}")
            return value
        return self._number(value)

    def _number(self, value: Any) -> int | float:
        whole = self.kind == "int"
        ok = isinstance(value, numbers.Integral if whole else numbers.Real) and not isinstance(value, bool)
        if not ok:
            what = "an integer" if whole else "a number"
            raise HeadRankError(f"`{self.name}` must be {what} ({self.bounds()}); got {type(value).__name__} "
                                f"{_shown(value)}")
        v, high = (int(value) if whole else _float(value)), self.upper()
        inside = (whole or math.isfinite(v)) and (v > self.low if self.open_low else v >= self.low) and (
            high is None or (v < high if self.open_high else v <= high))
        if not inside:
            verb = "must lie in" if high is not None else "must be"
            note = f" ({self.note})" if self.note else ""
            raise HeadRankError(f"`{self.name}` {verb} {self.bounds()}{note}; got {_shown(v)}")
        return v

    def example_bad(self) -> Any:
        """A value out of bounds, for the tests: one past a bound, or a name not among the choices."""
        if self.kind in ("choice", "pattern"):
            return "bogus"
        high = self.upper()
        if high is not None:
            return int(high) + 1 if self.kind == "int" else float(high) + 1.0
        return int(self.low) - 1 if self.kind == "int" else float(self.low) - 1.0


@dataclass(frozen=True)
class Table:
    """The bounded parameters of one verb, by Python name."""

    verb: str
    params: tuple[Param, ...]
    by_name: dict[str, Param] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_name", {p.name: p for p in self.params})

    def __getitem__(self, name: str) -> Param:
        return self.by_name[name]

    def __iter__(self):
        return iter(self.params)

    def check(self, **values: Any) -> dict[str, Any]:
        """Every given value checked by its parameter, in the table's order (the first bad one
        is the line); the checked values by name."""
        unknown = set(values) - set(self.by_name)
        if unknown:  # a programming error of the caller, not the user's input
            raise KeyError(f"{self.verb}: no parameter {sorted(unknown)} in its constraints table")
        return {p.name: p.check(values[p.name]) for p in self.params if p.name in values}


# -- the parameters several verbs share, declared once ---------------------------------------------
THREADS = Param("threads", "int", low=1, high=max_threads, help_high="4 per CPU",
                note=f"{PER_CPU} per CPU this process may use; 1 is best on a shared machine")
WORKERS = Param("workers", "int", low=1, high=max_threads, help_high="4 per CPU",
                note=f"{PER_CPU} per CPU this process may use")
TOL = Param("tol", "float", low=0, high=1, open_low=True, open_high=True, optional=False)
DEVICE = Param("device", "pattern", pattern=r"auto|cpu|cuda(:\d{1,4})?", text="auto, cpu, cuda or cuda:N")
PRECISION = Param("precision", "choice", choices=("auto", "float64"), optional=False)
#: the output dtypes of ``compress --dtype`` (auto: the source's, bfloat16 for a GGUF file)
DTYPES = ("auto", "bfloat16", "float16", "float32")

SPECTRA = Table("spectra", (
    TOL, THREADS, DEVICE, PRECISION,
    Param("format", "choice", choices=("table", "csv", "json"), api=False, optional=False),
    Param("max_bytes", "int", low=1, api=False),
))

TRACK = Table("track", (TOL, WORKERS))

COMPRESS = Table("compress", (
    Param("keep", "float", low=0, high=1, open_low=True),
    Param("rank", "int", low=1),
    Param("params", "float", low=0, high=1, open_low=True),
    Param("format", "choice", choices=("factored", "dense")),
    Param("allocate", "choice", choices=("energy", "loss"), optional=False),
    Param("dataset", "choice", choices=("wikitext2", "c4")),
    Param("dtype", "choice", choices=DTYPES, optional=False),
    Param("n_eval", "int", low=1, flag="--eval-n"),
    Param("n_calib", "int", low=1, flag="--calib-n"),
    Param("seq_len", "int", low=2),
    replace(THREADS, optional=False), DEVICE, PRECISION,
))

SCALE = Table("scale", (
    Param("tol", "float", low=0, open_low=True, optional=False),  # a relative deviation: any positive size
    replace(THREADS, optional=False),
))

COLLAPSE = Table("collapse", (
    Param("seqs", "int", low=2, note="a mean and a spread over a batch", optional=False),
    Param("max_tokens", "int", low=2, optional=False),
    replace(THREADS, optional=False),
))

#: the largest training seed (torch's generators take 64-bit seeds; offsets stay below the limit)
MAX_SEED = 2**63 - 1


def _run(name: str, kind: str = "int", low: float = 1, cli: bool = True, **kw: Any) -> Param:
    return Param(name, kind, low=low, cli=cli, optional=False, **kw)


#: ``headrank train recall|lm|vit``: the run's fields (each task's own, such as ``seq_len`` or
#: ``image_size``, are bounded by its config)
TRAIN = Table("train", (
    _run("steps"), _run("batch_size"), _run("log_every"), _run("track_every"), _run("checkpoint_every"),
    _run("warmup", low=0, cli=False),
    _run("schedule", "choice", cli=False, choices=("constant", "cosine")),
    _run("seed", low=0, high=MAX_SEED, note="a 63-bit generator seed"),
    _run("lr", "float", low=0, high=10, open_low=True),
    _run("weight_decay", "float", low=0, high=1e3, flag="--wd"),
    _run("attn_weight_decay", "float", low=0, high=1e3, flag="--attn-wd"),
    _run("beta1", "float", low=0, high=1, open_high=True, cli=False),
    _run("beta2", "float", low=0, high=1, open_high=True, cli=False),
    _run("eps", "float", low=0, high=1, open_low=True, cli=False),
    _run("grad_clip", "float", low=0, cli=False),
    replace(TOL, cli=False),
    replace(THREADS, optional=False),
))

#: ``headrank sweep`` on local workers (on Ray, a run's threads are the cluster's to bound)
SWEEP = Table("sweep", (WORKERS, replace(THREADS, optional=False)))

TABLES: dict[str, Table] = {t.verb: t for t in (SPECTRA, TRACK, COMPRESS, SCALE, COLLAPSE, TRAIN, SWEEP)}


def flags() -> dict[str, str]:
    """Every declared parameter whose flag is not ``--`` + its name with dashes: name → flag."""
    return {p.name: p.long for t in TABLES.values() for p in t if p.flag}


#: the most indices a ``layers`` list may hold (far above any model's depth: it stops an endless iterator)
MAX_SELECTION = 2**20


def layers_arg(layers: Any) -> list[int] | str | None:
    """``layers`` as a selection: None (all), a spec string (parsed against the model's depth
    where it is read), or a non-empty list of integer indices."""
    if layers is None or isinstance(layers, str):
        return layers
    if isinstance(layers, (bytes, dict)) or not isinstance(layers, Iterable):
        raise HeadRankError(f"`layers` must be a spec like '0,2,5-7' or a list of layer indices; got "
                            f"{type(layers).__name__} {_shown(layers)}")
    try:  # a 0-d array is Iterable but not iterable; an endless iterator is cut off
        sel = list(itertools.islice(layers, MAX_SELECTION + 1))
    except TypeError:
        raise HeadRankError(f"`layers` must be a spec like '0,2,5-7' or a list of layer indices; got "
                            f"{type(layers).__name__} {_shown(layers)}") from None
    if len(sel) > MAX_SELECTION:
        raise HeadRankError(f"`layers` lists more than {MAX_SELECTION:,} indices (no model is that deep)")
    if not sel:
        raise HeadRankError("`layers` is empty: select at least one layer (or pass None for all)")
    bad = next((i for i in sel if isinstance(i, bool) or not isinstance(i, numbers.Integral)), None)
    if bad is not None:
        raise HeadRankError(f"`layers` must be integers; got {type(bad).__name__} {_shown(bad)}")
    return [int(i) for i in sel]
