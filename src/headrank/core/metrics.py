"""The one metric table: every per-head measure of a product ``A Bᵀ``, defined once.

Each :class:`Metric` row names a measure, states its definition, unit and direction, the products
it applies to, and computes it from the quantities :mod:`headrank.core.linalg` gets from the
factors (the singular values ``sv`` and the factor norms ``frob_bound``, ``balance``,
``gram_scale = ‖AᵀA‖_F + ‖BᵀB‖_F``) and the rows above it. ``heads.csv``, ``summary.csv``, the
tracker, ``headrank track``, the console tables and the training callback all read this table:
adding a per-head metric is adding a row (and its dense reference test in
``tests/core/test_metrics.py``).

Semantics of the rank measures (functions below; same for every caller, tested against numpy
float64 references):

- input: singular values ``sv`` of shape ``(..., k)``, descending, ≥ 0, any float dtype (upcast
  to float64), torch or numpy; a one-dimensional ``sv`` ``(k,)`` is one item (0-d results);
  ``k = 0`` is the zero matrix.
- zero item (``σ₁ = 0``): numerical rank 0, effective rank 0, stable rank 0, energy ranks 0 (a
  zero matrix uses no dimension); ``gap_rel`` and ``balance_rel`` 0 (a zero factorisation is
  balanced and meets its bound).
- non-finite item (any ``σ`` NaN or ±Inf): float measures NaN; the integer measures (numerical
  and energy ranks) are −1 at this level (an integer tensor holds no NaN); :class:`ProductMetrics
  <headrank.core.linalg.ProductMetrics>` reports every measure of a non-finite head as NaN.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where used (``headrank --help`` reads DEFAULT_TOL without it)
    import numpy as np
    import torch

DEFAULT_TOL = 1e-3
PRODUCTS = ("qk", "ov")


def _sv(sv: Any) -> np.ndarray:
    """``sv`` as a float64 numpy array of shape ``(..., k ≥ 1)`` (``k = 0``: one zero value)."""
    import numpy as np

    if type(sv).__module__.startswith("torch"):  # a torch tensor (any device, dtype)
        import torch

        sv = sv.detach().to(device="cpu", dtype=torch.float64).numpy()
    sv = np.asarray(sv, dtype=np.float64)
    if sv.ndim == 0:
        raise ValueError("singular values need a last axis (..., k); got a scalar")
    sv = np.ascontiguousarray(sv)
    if sv.shape[-1] == 0:
        sv = np.zeros((*sv.shape[:-1], 1), dtype=np.float64)
    return sv


def _f64(x: Any) -> np.ndarray:
    """Any number, array or tensor as a float64 numpy array (same shape)."""
    import numpy as np

    if type(x).__module__.startswith("torch"):
        import torch

        return x.detach().to(device="cpu", dtype=torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def _torch(x: Any) -> torch.Tensor:
    """A numpy result as the torch tensor the public functions below return (as they always did)."""
    import numpy as np
    import torch

    return torch.from_numpy(np.asarray(x))


# -- the measures, in numpy (the metric table and linalg's numpy route use these directly) -----
def _finite(sv: np.ndarray) -> np.ndarray:
    import numpy as np

    return np.isfinite(sv).all(-1)


def _nan_where_not(finite: np.ndarray, value: np.ndarray) -> np.ndarray:
    import numpy as np

    return np.where(finite, value, np.nan)


def _vector_norm(sv: np.ndarray) -> np.ndarray:
    import numpy as np

    return np.sqrt((sv * sv).sum(-1))


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    import numpy as np

    zero = den == 0
    return np.where(zero, np.zeros_like(num), num / np.where(zero, np.ones_like(den), den))


def _numerical_rank(sv: np.ndarray, tol: float) -> np.ndarray:
    import numpy as np

    s1 = sv[..., 0]
    rank = (sv > tol * s1[..., None]).sum(-1, dtype=np.int64)
    rank = np.where(s1 > 0, rank, 0)
    return np.where(_finite(sv), rank, -1).astype(np.int64)


def _effective_rank(s: np.ndarray) -> np.ndarray:
    import numpy as np

    total = s.sum(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = s / total
        h = -np.where(p > 0, p * np.log(p), 0.0).sum(-1)
    eff = np.where(total[..., 0] > 0, np.exp(h), 0.0)
    return _nan_where_not(_finite(s), np.asarray(eff, dtype=np.float64))


def _stable_rank(s: np.ndarray) -> np.ndarray:
    import numpy as np

    s1 = s[..., 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        stable = np.where(s1 > 0, (s * s).sum(-1) / s1**2, 0.0)
    return _nan_where_not(_finite(s), np.asarray(stable, dtype=np.float64))


def _energy_rank(sv: np.ndarray, fraction: float) -> np.ndarray:
    import numpy as np

    with np.errstate(invalid="ignore", over="ignore"):
        energy = np.cumsum(sv**2, axis=-1)
        total = energy[..., -1:]
        # k = 1 + #{j : cum_j < fraction * total}; relative slack of 1e-12 keeps fraction = 1 exact
        below = energy < fraction * total * (1 - 1e-12)
    k = 1 + below.sum(-1, dtype=np.int64)
    k = np.where(total[..., 0] > 0, k, 0)
    return np.where(_finite(sv), k, -1).astype(np.int64)


# -- the public functions: any input, torch tensors out ---------------------------------------
def ratio(num: Any, den: Any) -> torch.Tensor:
    """``num / den`` with 0 where ``den == 0`` (a zero product); NaN stays NaN."""
    return _torch(_ratio(_f64(num), _f64(den)))


def numerical_rank(sv: Any, tol: float = DEFAULT_TOL) -> torch.Tensor:
    """``#{σᵢ > tol·σ₁}`` (int64); 0 for a zero item, −1 for a non-finite one."""
    if not tol > 0:
        raise ValueError(f"tolerance must be > 0, got {tol}")
    return _torch(_numerical_rank(_sv(sv), tol))


def effective_rank(sv: Any) -> torch.Tensor:
    """``exp(H(p))``, ``p = σ/Σσ`` (Roy & Vetterli); 0 for a zero item, NaN for a non-finite one."""
    return _torch(_effective_rank(_sv(sv)))


def stable_rank(sv: Any) -> torch.Tensor:
    """``Σσ² / σ₁²``; 0 for a zero item, NaN for a non-finite one."""
    return _torch(_stable_rank(_sv(sv)))


def energy_rank(sv: Any, fraction: float) -> torch.Tensor:
    """The fewest leading singular values holding ``fraction`` of ``Σσ²`` (the energy), per item.

    ``sv`` is descending, shape ``(..., k)``; ``0 < fraction ≤ 1``. An all-zero item has energy
    rank 0; an item holding NaN has no energy rank: -1 (the caller reports it as missing).
    """
    if not (0 < fraction <= 1):
        raise ValueError(f"energy fraction must be in (0, 1], got {fraction}")
    return _torch(_energy_rank(_sv(sv), fraction))


def rank_measures(sv: Any, tol: float = DEFAULT_TOL) -> dict[str, torch.Tensor]:
    """Numerical, effective and stable rank from descending singular values ``(..., k)``."""
    return {"rank": numerical_rank(sv, tol), "effective_rank": effective_rank(sv), "stable_rank": stable_rank(sv)}


Inputs = Mapping[str, Any]  # sv, frob_bound, balance, gram_scale, tol, and the rows computed so far


@dataclass(frozen=True)
class Metric:
    """One per-head measure of a product ``A Bᵀ`` (a row of :data:`METRICS`).

    ``definition``: the formula in words (meta.json, README); ``unit``: ``dims`` (a count of
    dimensions), ``product`` (the scale of the product's entries: W·W) or ``ratio``;
    ``direction``: what a larger value means; ``products``: which products it is reported for;
    ``compute(q)``: the value from :data:`Inputs`; ``integer``: a count (−1 = missing before
    NaN-masking); ``summary``: averaged per layer in summary tables, the tracker's scalars and
    the callback; ``console``: ``(position, header)`` in the console tables, if shown there.
    """

    name: str
    definition: str
    unit: str
    direction: str
    compute: Callable[[Inputs], Any]
    integer: bool = False
    summary: bool = False
    console: tuple[int, str] | None = None
    products: tuple[str, ...] = PRODUCTS


_SCALE = "larger = a larger product (weight scale)"
_DIMS = "larger = more of the head's dimensions used"

METRICS: tuple[Metric, ...] = (
    Metric("sv_max", "sigma_1, the spectral norm of A B^T", "product", _SCALE, lambda q: q["sv"][..., 0]),
    Metric("nuclear", "sum sigma_i, the nuclear norm of A B^T", "product", _SCALE, lambda q: q["sv"].sum(-1)),
    Metric("frob", "sqrt(sum sigma_i^2), the Frobenius norm of A B^T", "product", _SCALE,
           lambda q: _vector_norm(q["sv"])),
    Metric("frob_bound", "(||A||_F^2 + ||B||_F^2) / 2 >= nuclear (paper Prop. 3.1)", "product", _SCALE,
           lambda q: q["frob_bound"]),
    Metric("gap", "frob_bound - nuclear >= 0; 0 iff A^T A = B^T B", "product", "larger = further from balanced",
           lambda q: q["frob_bound"] - q["nuclear"]),
    Metric("balance", "||A^T A - B^T B||_F", "product", "larger = further from balanced", lambda q: q["balance"]),
    Metric("balance_rel", "balance / (||A^T A||_F + ||B^T B||_F); 0 for a zero product", "ratio",
           "larger = further from balanced (0 = balanced)", lambda q: _ratio(q["balance"], q["gram_scale"]),
           summary=True, console=(4, "bal")),
    Metric("rank", "numerical rank #{sigma_i > tol * sigma_1} (tol relative)", "dims", _DIMS,
           lambda q: _numerical_rank(q["sv"], q["tol"]), integer=True, summary=True),
    Metric("effective_rank", "exp(entropy of sigma / sum sigma) (Roy & Vetterli)", "dims", _DIMS,
           lambda q: _effective_rank(q["sv"]), summary=True, console=(1, "eff")),
    Metric("stable_rank", "sum sigma^2 / sigma_1^2", "dims", _DIMS, lambda q: _stable_rank(q["sv"]), summary=True),
    Metric("k90", "energy rank: fewest sigma_i holding 90% of sum sigma^2", "dims", _DIMS,
           lambda q: _energy_rank(q["sv"], 0.90), integer=True, summary=True, console=(2, "k90")),
    Metric("k99", "energy rank: fewest sigma_i holding 99% of sum sigma^2", "dims", _DIMS,
           lambda q: _energy_rank(q["sv"], 0.99), integer=True, summary=True),
    Metric("k999", "energy rank: fewest sigma_i holding 99.9% of sum sigma^2", "dims", _DIMS,
           lambda q: _energy_rank(q["sv"], 0.999), integer=True, summary=True),
    Metric("gap_rel", "gap / frob_bound, in [0, 1]; 0 for a zero product", "ratio",
           "larger = further from balanced (0 = balanced)", lambda q: _ratio(q["gap"], q["frob_bound"]),
           summary=True, console=(3, "gap")),
)

BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}
METRIC_COLUMNS: tuple[str, ...] = tuple(m.name for m in METRICS)
#: the per-head metrics averaged per layer (summary.csv, track, tracker scalars, the callback), the
#: console ones first (effective rank, k90, gap / bound, balance), then the rest in table order
SUMMARY_METRICS: tuple[str, ...] = tuple(m.name for m in sorted(
    (m for m in METRICS if m.summary), key=lambda m: m.console[0] if m.console else len(METRICS)))
#: the console tables' columns, in order: (metric, header, format spec)
CONSOLE_METRICS: tuple[tuple[str, str, str], ...] = tuple(
    (m.name, m.console[1], {"dims": ".2f", "ratio": ".4f"}.get(m.unit, ".4g"))
    for m in sorted((m for m in METRICS if m.console), key=lambda m: m.console[0]))
#: the console tables' caption; the caller says where the definitions are (meta.json only with --out)
CONSOLE_CAPTION = "; ".join(f"{h} = {n}" for n, h, _ in CONSOLE_METRICS if h != n) + " (mean over heads)"


#: the energy levels of the table's own energy-rank rows (``spectra --energy`` adds others)
ENERGY_LEVELS = (0.90, 0.99, 0.999)


def energy_name(level: float) -> str:
    """The column of energy level ``level``: 0.9 -> ``k90``, 0.99 -> ``k99``, 0.999 -> ``k999``,
    0.95 -> ``k95``, 1 -> ``k100``."""
    digits = f"{level:.10f}".rstrip("0").split(".")[1] if level < 1 else "100"
    return "k" + digits.ljust(2, "0")


def energy_levels(spec: str | Any) -> tuple[float, ...]:
    """``"0.9,0.99,0.999"`` (or numbers) as energy levels, each in (0, 1], at most 6 decimals, no repeats;
    ValueError otherwise."""
    items = [x.strip() for x in spec.split(",")] if isinstance(spec, str) else list(spec)
    levels = []
    for x in items:
        try:
            v = float(x)
        except (TypeError, ValueError):
            raise ValueError(f"an energy level must be a number in (0, 1]; got {x!r}") from None
        if not 0 < v <= 1 or round(v, 6) != v:
            raise ValueError(f"an energy level must be in (0, 1] with at most 6 decimals; got {x!r}")
        levels.append(v)
    if not levels or len({energy_name(v) for v in levels}) != len(levels):
        raise ValueError(f"energy levels must be distinct and at least one; got {spec!r}")
    return tuple(levels)


def energy_columns(sv: Any, levels: Any) -> dict[str, np.ndarray]:
    """``{k…: energy rank}`` for each of ``levels`` that the metric table lacks (``spectra --energy``)."""
    return {energy_name(v): _energy_rank(_sv(sv), v) for v in levels if energy_name(v) not in BY_NAME}


def evaluate(inputs: Inputs) -> dict[str, np.ndarray]:
    """Every row of :data:`METRICS`, in order, from :data:`Inputs` (float64 numpy arrays; each row
    sees those above it)."""
    q = dict(inputs)
    for m in METRICS:
        q[m.name] = m.compute(q)
    return {m.name: q[m.name] for m in METRICS}


def from_singular_values(sv: Any, frob_bound: Any, balance: Any, gram_scale: Any,
                         tol: float = DEFAULT_TOL) -> dict[str, np.ndarray]:
    """Every metric from singular values and the factor norms (batch shape), as numpy arrays
    (float64; the counts int64): computed in numpy, so no torch is needed."""
    return evaluate({"sv": _sv(sv), "frob_bound": _f64(frob_bound), "balance": _f64(balance),
                     "gram_scale": _f64(gram_scale), "tol": tol})


def conventions(tol: float) -> dict[str, str]:
    """``{name: definition}`` of every metric (meta.json's conventions), with ``tol`` filled in."""
    return {m.name: m.definition.replace("tol *", f"{tol:g} *") for m in METRICS}
