"""Cut each head to the rank it uses and say what that costs (``headrank compress``).

- :mod:`.plan`: ranks by energy (``keep``), fixed (``rank``) or a global budget (``params``);
- :mod:`.cut`: the exact best rank-k cut of every unit (a head, or a kv head's query group),
  balanced factors, biases kept exact at full rank, activation whitening (SVD-LLM);
- :mod:`.factored`: the factored checkpoint (only the kept dimensions) and :func:`load_compressed`;
- :mod:`.latent`: its latent KV cache (:func:`latent_cache`), through transformers' attention
  and cache interfaces;
- :mod:`.allocate`: ``allocate="loss"``, ranks from measured loss sensitivities (ASVD);
- :mod:`.write`: safetensors shards and side files;
- :mod:`.evaluate`: perplexity or embedding drift with the real Hugging Face forward;
- :mod:`.options`: the options' checks, the text protocol, the cached uncut baseline;
- :mod:`.report` / :mod:`.result`: compress.json and :class:`CompressResult`;
- :mod:`.api`: the pass over the layers (two for a global budget); :mod:`.kept`: the factored
  tensors from the kept columns; :mod:`.run`: :func:`compress` and :func:`cost_curve`.

``headrank.compress`` is both this package and the verb: calling the package calls
:func:`compress` (``headrank.compress(src, out, keep=0.99)``), so the public function and the
wing keep one name. This file only re-exports.
"""

from __future__ import annotations

import sys
import types

from headrank.compress import options
from headrank.compress.api import Plan, make_plan
from headrank.compress.evaluate import TextSpec
from headrank.compress.factored import load_compressed
from headrank.compress.latent import cache_kwarg, latent_cache
from headrank.compress.plan import Rule
from headrank.compress.report import report_lines
from headrank.compress.result import CompressResult
from headrank.compress.run import compress, cost_curve, cut_in_place, kept_fraction

__all__ = ["CompressResult", "Plan", "Rule", "TextSpec", "cache_kwarg", "compress", "cost_curve", "cut_in_place",
           "kept_fraction", "latent_cache", "load_compressed", "make_plan", "options", "report_lines"]


class _Verb(types.ModuleType):
    """The package, callable as the verb it is named after."""

    def __call__(self, *args, **kwargs):
        return compress(*args, **kwargs)


sys.modules[__name__].__class__ = _Verb
__signature__ = __import__("inspect").signature(compress)
