"""Rank collapse of token representations across depth (Dong, Cordonnier, Loukas, ICML 2021).

The package, by part (docs/methods/collapse.md):

- :mod:`~headrank.analysis.collapse.measures`: relative residual ``‖X − 1xᵀ‖ / ‖X‖`` in the
  ℓ1, ℓ∞, composite ``√(ℓ1·ℓ∞)`` and Frobenius norms (mean row or best-fit row), pairwise
  cosine similarity, effective and stable rank. The primary measure is ``res_composite``.
- :mod:`~headrank.analysis.collapse.surgery`: a model's variants built from its own modules
  (:data:`SURGERY_VARIANTS`: ``pure`` attention only, ``mlp`` attention + MLP, ``skip``
  attention + skips, ``full`` the unmodified model), module paths from the architecture table
  (:mod:`headrank.io.layouts`, a row's ``modules``).
- :mod:`~headrank.analysis.collapse.analyze`: :func:`analyze` runs real sentences through a
  model (opened by :mod:`headrank.models.opener`) and its variants, pretrained and
  re-initialised, and measures every layer; :func:`save` writes its files.
- :mod:`~headrank.analysis.collapse.paths`: path counts ``C(L,k)·H^k``, products of
  attention matrices along sampled head paths, the project's model restricted to paths of
  each length (:func:`path_restricted`).
- :mod:`~headrank.analysis.collapse.depth`: the depth sweep of pure self-attention networks
  (and the same networks with other head counts) and the exponential / doubly exponential
  fits of ``log r_L``.
- :mod:`~headrank.analysis.collapse.exact`: the residual of a pure self-attention network
  carried through its layers without cancellation, past the float64 floor.
- :mod:`~headrank.analysis.collapse.ensemble`: a network with skips as an ensemble of shallow
  networks (one member per subset of layers): the short paths' share and the members'
  dependence.
- :mod:`~headrank.analysis.collapse.bound`: the stated bound as an inequality (β from the
  weights; γ given, or the γ where it turns), and MLP Lipschitz upper bounds.

Supported models: BERT-style (``bert``, ``roberta``, ``xlm-roberta``, ``electra``), GPT-2,
LLaMA-style (``llama``, ``mistral``, ``qwen2``) Hugging Face directories, the shipped
``minilm``, and the project's own Transformer (a saved model directory, or a training run
directory, whose newest checkpoint is used).
"""

from headrank.analysis.collapse.analyze import CollapseResult, analyze, collapse, save
from headrank.analysis.collapse.depth import (
    FLOOR,
    byte_batch,
    depth_sweep,
    fit_depth,
    heads_sweep,
    mlp_dose_response,
    pure_attention_config,
    san_model,
)
from headrank.analysis.collapse.ensemble import (
    bert_ensemble,
    ensemble_measures,
    members,
    pretrained_ensemble,
    project_ensemble,
)
from headrank.analysis.collapse.exact import san_residuals
from headrank.analysis.collapse.measures import (
    CENTERS,
    MEASURES,
    NORMS,
    PRIMARY,
    best_row,
    cosine_similarity,
    linf_best_row,
    matrix_norm,
    residual,
    token_measures,
)
from headrank.analysis.collapse.paths import (
    WELL_KNOWN,
    enumerate_paths,
    path_counts,
    path_length_stats,
    path_products,
    path_restricted,
    path_table,
)
from headrank.analysis.collapse.surgery import (
    INITS,
    SURGERY_VARIANTS,
    VARIANT_LABELS,
    VARIANT_SWITCHES,
    HFAdapter,
    ProjectAdapter,
    collapse_model_types,
    make_adapter,
    run_variant,
    surgery_modules,
)

__all__ = [
    "CENTERS", "FLOOR", "INITS", "MEASURES", "NORMS", "PRIMARY", "SURGERY_VARIANTS", "VARIANT_LABELS",
    "VARIANT_SWITCHES", "WELL_KNOWN", "CollapseResult", "HFAdapter", "ProjectAdapter", "analyze", "best_row", "collapse",
    "bert_ensemble", "byte_batch", "collapse_model_types", "cosine_similarity", "depth_sweep", "ensemble_measures",
    "enumerate_paths", "fit_depth", "heads_sweep", "linf_best_row", "make_adapter", "matrix_norm", "members",
    "mlp_dose_response", "path_counts", "path_length_stats", "path_products", "path_restricted", "path_table",
    "pretrained_ensemble", "project_ensemble", "pure_attention_config", "residual", "run_variant", "san_model",
    "san_residuals", "save", "surgery_modules", "token_measures",
]
