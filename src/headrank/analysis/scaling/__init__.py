"""Scale invariance of a model's function (docs/methods/scale.md; source document 002), behind
``headrank scale MODEL``:

- :mod:`.invariance`: the per-tensor test (``W → cW``: invariant, homogeneous of degree k,
  neither, no effect, zero), measured with normalisation epsilon 0 for the verdicts;
- :mod:`.symmetries`: the per-head attention pair symmetries (W_Q ↔ W_K, W_V ↔ P), found through
  the layout table's :class:`~headrank.io.layouts.AttentionReader` (aliases included);
- :mod:`.analyze`: the analysis of one model (opened in float64 with fixed real inputs by
  :func:`headrank.models.opener.open_model`) and its files.

The training experiment on ReLU + LayerNorm MLPs lives in :mod:`headrank.training.batched`
and the reproduction in :mod:`headrank.studies.scale`.
"""

from headrank.analysis.scaling.analyze import (
    ScaleResult,
    analyze_scaling,
    layout_or_note,
    parse_group,
    save,
    scale,
)
from headrank.analysis.scaling.invariance import (
    DEFAULT_SCALES,
    INVARIANCE_TOL,
    TENSOR_VERDICTS,
    check_scales,
    classify_outputs,
    norm_eps_zero,
    parse_scales,
    perturbed,
    resolve_groups,
    scale_test,
    scaled,
    verdict_counts,
)
from headrank.analysis.scaling.symmetries import (
    AttentionSite,
    attention_sites,
    pair_edits,
    pair_symmetries,
)

__all__ = [
    "DEFAULT_SCALES", "INVARIANCE_TOL", "TENSOR_VERDICTS", "AttentionSite", "ScaleResult",
    "analyze_scaling", "attention_sites", "check_scales", "classify_outputs", "layout_or_note", "norm_eps_zero",
    "pair_edits", "pair_symmetries", "parse_group", "parse_scales", "perturbed", "resolve_groups", "save", "scale",
    "scale_test", "scaled", "verdict_counts",
]
