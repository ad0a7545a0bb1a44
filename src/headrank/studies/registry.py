"""The reproductions' vocabulary: :class:`Claim`, :class:`FigureOut`, :class:`Result`, and the
registry of studies by name (``headrank reproduce --list`` reads :data:`CATALOGUE` without
importing any study)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from headrank.errors import HeadRankError
from headrank.studies.verdicts import combine
from headrank.util.fileio import jsonable

# name → (module that registers it, one-line title). Imported lazily by get().
CATALOGUE: dict[str, tuple[str, str]] = {
    "designs": ("headrank.studies.designs", "Run designs fixed before they run: decoupling best against best, online "
                                            "high-rank recall at exposure 8, exposure invariance (profile designs)"),
    "fig1": ("headrank.studies.fig1", "Figure 1 + Proposition 3.1: gradient descent on 5x5 factors; "
                              "L2 on factors becomes nuclear norm on the product"),
    "fig5": ("headrank.studies.fig5", "Figure 5: 2-D toy, AdamW vs Adam+L2, direct (L2 optimum) and "
                              "factorized w = a*b (L1 optimum)"),
    "collapse": ("headrank.studies.collapse", "Rank collapse: pure attention loses rank doubly exponentially with depth; "
                                      "skips prevent it, MLPs slow it (MiniLM surgery, depth sweep, paths)"),
    "fig4": ("headrank.studies.fig4", "Figure 4: balance of attention factors (nuclear norm vs Frobenius bound, row "
                                       "norms) against rotation and row-pairing nulls: our LMs at known decay exposure "
                                       "(judged), MiniLM-L6 or --model PATH (described)"),
    "fig2": ("headrank.studies.fig2", "Figure 2: 2-layer transformer on associative recall; attention weight decay "
                                     "lowers the rank of P W_V, balances the factors, closes the nuclear-norm gap"),
    "fig3": ("headrank.studies.fig3", "Figure 3: rank of W_K^T W_Q and P W_V against attention weight decay; byte-level LM "
                                  "(middle layer, per head) and ViT on digits (all heads and layers)"),
    "table1": ("headrank.studies.table1", "Table 1: LM test perplexity over attention decay x MLP decay (mean +- std over "
                                    "seeds); does attention decay hurt, does decoupling help"),
    "decouple": ("headrank.studies.decouple", "Table 1's decoupling question where decay may help: the LM on a corpus "
                                              "small enough to overfit; coupled vs decoupled decay, chosen on validation, "
                                              "judged on test perplexity"),
    "scale": ("headrank.studies.scale", "Scale invariance and weight decay: ReLU+LayerNorm MLPs on digits (no residual, post-norm, pre-norm); effective learning rate, angular update, equilibrium norm"),
    "compress": ("headrank.studies.compress", "Our check: does attention trained with weight decay compress at a lower "
                                              "perplexity cost? (LM at exposures 0-8, cut to the same budgets)"),
}


# name → (the document's own statement a reproduction tests, where it comes from); quoted at the
# top of each section of the report.
QUOTES: dict[str, tuple[str, str]] = {
    "fig1": ("For all cases, other than λ=0, the trajectory converges exponentially quickly to 0 as predicted by "
             "our theory. [...] As predicted the discrepancy exponentially vanishes, with a time constant "
             "proportional to the λ. [...] As predicted, s_i decays linearly with λ, until λ ≥ s_i, at which point "
             "the singular value vanishes.", "Kobayashi et al. 2024, Figure 1 caption; Proposition 3.1"),
    "fig2": ("We observe that rank reduction correlates strongly with weight decay strength. [...] the "
             "discrepancy nonetheless vanishes quickly, with a time constant which perfectly correlates with the "
             "decay strength. [...] the difference approaches 0, and thus the bound becomes tight.",
             "Kobayashi et al. 2024, Figure 2 caption"),
    "fig3": ("In all cases, we observe again that rank reduction correlates strongly with weight decay strength "
             "when optimizing with AdamW. The weight decay strength of 0.1 commonly used to pretrain some known "
             "large foundation models in fact noticeably reduces the rank of the generated matrices compared to "
             "when weight decay is turned off.", "Kobayashi et al. 2024, Figure 3 caption"),
    "fig4": ("The condition W_K W_K^T = W_Q W_Q^T would require these norms to be equal, which in fact is mostly "
             "true. [...] the scatter plot mapping the Frobenius norm against the nuclear norm for all heads across "
             "all layers. The two norms almost perfectly coincide.",
             "Kobayashi et al. 2024, Figure 4 caption (LLaMA-2 7B)"),
    "fig5": ("As conjectured, the convergence point of AdamW given the hyperparameter ε and decay strength λ_wd "
             "corresponds to that of the equilibrium point of the L2-regularized loss with regularization strength "
             "λ_L2 = λ_wd ε. [...] the solution found now corresponds to those of the loss regularized by the "
             "L1-norm of w1, w2.", "Kobayashi et al. 2024, Figure 5 caption"),
    "table1": ("We find that, in accordance with existing work, inducing low rank in attention matrix products can "
               "damage language model performance, and observe advantages when decoupling weight decay in "
               "attention layers from the rest of the parameters.", "Kobayashi et al. 2024, abstract (Table 1)"),
    "decouple": ("observe advantages when decoupling weight decay in attention layers from the rest of the parameters",
                 "Kobayashi et al. 2024, abstract (Table 1)"),
    "collapse": ("SANs, particularly those lacking skip connections and multi-layer perceptrons (MLPs), lose their "
                 "expressive power at a rate that doubles exponentially with the increase in network depth. [...] "
                 "Skip connections help prevent rank collapse, while MLPs slow down the convergence.",
                 "article on Dong, Cordonnier, Loukas 2021"),
    "scale": ("for every network with such architecture, we can design an equivalent network (i.e. computing "
              "exactly the same function) with arbitrarily small weight matrix norms [...] (pre-norm) residual "
              "connections break the scale invariance [...] there is still the question of whether these solutions "
              "are actually found using gradient descent.", "article 'Weight Decay is Useless Without Residual "
                                                             "Connections'"),
}


VERDICTS = ("held", "not held", "inconclusive")
KINDS = ("finding", "identity", "check")


@dataclass
class Claim:
    """One checked claim, with numbers.

    ``kind``: ``finding`` (what a document reports from experiments; only these are tallied as
    the documents' findings), ``identity`` (algebra that can fail only through a bug: verified,
    listed apart) or ``check`` (what we added ourselves: sanity checks, standard theory; judged
    like a finding but tallied apart and never counted as a document's finding). ``verdict``: ``held``, ``not
    held`` (the effect is absent or reversed beyond the spread) or ``inconclusive`` (inside the
    spread, or the run's decay exposure is below what the claim needs; ``reason`` says which).
    Give either ``held=`` (a two-way verdict) or ``verdict=``; ``held`` is always kept equal to
    ``verdict == "held"``. ``measured`` and ``expected`` may be numbers, strings, lists or dicts
    (JSON-serialisable); ``tolerance`` says how close counts as agreement; ``detail`` says how
    it was measured; ``exposure`` records the decay exposure λ·Σlr a training finding got (and
    needed); ``key`` is the decisive measured number(s) in one short line, as a reader compares
    them with ``expected`` (the report's and the README's "measured" cell; ``measured`` holds
    everything, in the fold). ``untested``: the command that tests the statement, set when it
    could not be tested here (a model not on this machine); such a claim is inconclusive and its
    statement is listed as untested, not counted among those checked. ``rule_sha256``: the hash
    of the rule that judged it (:mod:`headrank.studies.prereg`), set by the runner;
    ``judged_by``: the study functions that built it (recorded here, hashed there). ``tests``:
    the three-way tests against declared margins that decided it
    (:func:`headrank.studies.verdicts.judge` records: interval, margin, n, one-sided p-values),
    read by the tally's family-wise control; a claim whose every test has n < 2 is untested.
    """

    name: str
    source: str
    statement: str
    measured: Any
    expected: Any
    held: bool | None = None
    tolerance: Any = None
    detail: str = ""
    kind: str = "finding"
    verdict: str | None = None
    reason: str = ""
    exposure: Any = None
    key: str = ""
    quote: str = ""
    supports: str = ""
    rule: str = ""
    untested: str = ""
    rule_sha256: str = ""
    judged_by: str = ""
    tests: list = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.verdict is None:
            if self.held is None:
                raise ValueError(f"claim {self.name}: give held= or verdict=")
            self.verdict = "held" if self.held else "not held"
        if self.verdict not in VERDICTS:
            raise ValueError(f"claim {self.name}: verdict {self.verdict!r} is not one of {VERDICTS}")
        if self.kind not in KINDS:
            raise ValueError(f"claim {self.name}: kind {self.kind!r} is not one of {KINDS}")
        if self.held is not None and bool(self.held) != (self.verdict == "held"):
            raise ValueError(f"claim {self.name}: held={self.held} contradicts verdict {self.verdict!r}")
        if self.kind == "identity" and self.verdict == "inconclusive":
            raise ValueError(f"claim {self.name}: an identity is verified or it is not")
        if self.untested and self.verdict != "inconclusive":
            raise ValueError(f"claim {self.name}: an untested statement has no verdict but inconclusive")
        self.held = self.verdict == "held"
        if not self.judged_by:
            from headrank.studies.prereg import caller

            self.judged_by = caller()

    def to_json(self) -> dict[str, Any]:
        return jsonable(asdict(self))


def g3(x: Any) -> str:
    """A number for a claim's ``key``: 3 significant digits (None as —)."""
    return "—" if x is None else f"{float(x):.3g}"


def series(values: dict[str, Any], name: str = "λ") -> str:
    """``{λ: value}`` as one line for a claim's ``key``: ``λ 0: 14.6, 1: 7.74, …``."""
    body = ", ".join(f"{k}: {g3(v)}" for k, v in values.items())
    return f"{name} {body}" if name else body


def arrow(values: Any) -> str:
    """A sequence (or a dict's values, in order) as ``7.1 → 5.7 → 1.5`` for a claim's ``key``."""
    return " → ".join(g3(v) for v in (values.values() if isinstance(values, dict) else values))


def span(values: Any) -> str:
    """``lo–hi`` of a sequence for a claim's ``key`` (— when empty)."""
    v = list(values)
    return f"{g3(min(v))}–{g3(max(v))}" if v else "—"


def supporting(c: dict[str, Any], names: set[Any]) -> bool:
    """Whether claim ``c`` is supporting evidence among claims named ``names``: it ``supports`` one
    of them. One that supports a claim of a reproduction not listed (``table1.decoupling_helps``
    reported without ``decouple``) is counted as the finding it is, so its statement still counts
    once."""
    return bool(c.get("supports")) and c["supports"] in names


def _untested_by_n(c: dict[str, Any]) -> bool:
    """A claim whose recorded tests all lack an interval (n < 2 or NaN): too small to decide."""
    t = c.get("tests") or []
    return bool(t) and all(x.get("verdict") == "untested" for x in t)


def statements(claims: list[dict[str, Any]], names: set[Any] | None = None) -> list[dict[str, Any]]:
    """The documents' statements these claims judge, each once: the counted findings (not
    supporting another listed claim) grouped by their row of the coverage table
    (:mod:`headrank.studies.coverage`; a finding in no row is its own statement). A statement's
    verdict combines its claims by the several-parts rule; one whose every claim is ``untested``
    (no model here, or n too small: every test without an interval) is ``untested`` (with the
    commands that would test it). Then Holm's family-wise control
    (:func:`headrank.studies.verdicts.holm`) over the statements whose claims carry tests: a
    held or not held that does not survive it is counted inconclusive (``holm`` says so)."""
    from headrank.studies.coverage import row_of
    from headrank.studies.verdicts import holm, statement_p

    names = {c.get("name") for c in claims} if names is None else names
    groups: dict[Any, list[dict[str, Any]]] = {}
    for c in claims:
        if c.get("kind", "finding") == "finding" and not supporting(c, names):
            row = row_of(c.get("name", ""))
            groups.setdefault(("row", row) if row is not None else ("claim", c.get("name") or id(c)), []).append(c)
    out = []
    for key, group in groups.items():
        tested = [c for c in group if not c.get("untested") and not _untested_by_n(c)]
        verdict = combine([c.get("verdict") or ("held" if c.get("held") else "not held") for c in tested]) if tested \
            else "untested"
        tests = [t for c in tested for t in (c.get("tests") or [])]
        out.append({"row": key[1] if key[0] == "row" else None, "claims": [c.get("name", "") for c in group],
                    "verdict": verdict, "untested": [c["untested"] or "n < 2: no interval" for c in group
                                                     if c.get("untested") or _untested_by_n(c)],
                    "p": statement_p(tests) if tests and all(c.get("tests") for c in tested) else None})
    _holm(out, holm)
    return out


def _holm(out: list[dict[str, Any]], holm: Callable[..., set[Any]]) -> None:
    """Holm over the statements with p-values: each held / not held keeps its verdict only if the
    p of its side is rejected in the family (``holm`` records the outcome on each statement)."""
    fam = {i: st["p"][0 if st["verdict"] == "held" else 1] for i, st in enumerate(out)
           if st["p"] is not None and st["verdict"] in ("held", "not held")}
    kept = holm(fam)
    for i, st in enumerate(out):
        if i in fam:
            st["holm"] = "kept" if i in kept else f"{st['verdict']} before Holm"
            if i not in kept:
                st["verdict"] = "inconclusive"
        elif st["verdict"] != "untested":
            st["holm"] = ("no p recorded (an exact computation, or a threshold rule without a declared-margin test): "
                          "outside the family" if st["p"] is None else "not in the family")


def tally(claims: list[dict[str, Any]], names: set[Any] | None = None) -> dict[str, Any]:
    """Counts for a headline: the documents' statements held / not held / inconclusive, each
    statement (a row of the coverage table) once (:func:`statements`: findings judging one
    statement combine; a claim that ``supports`` another listed claim is not counted again),
    statements that could not be tested here apart (``untested``), our own checks apart,
    identities verified / failed.

    Takes claim dicts as written to claims.json (older files without ``kind``/``verdict`` count
    as two-way findings). ``names``: the claims reported beside these (default: these), so a
    reproduction's row of a combined report counts as the combined tally does."""
    out = {"findings": dict.fromkeys(VERDICTS, 0), "identities": {"verified": 0, "failed": 0},
           "checks": dict.fromkeys(VERDICTS, 0), "supporting": 0, "untested": 0, "holm_family": 0,
           "holm_demoted": 0}
    names = {c.get("name") for c in claims} if names is None else names
    for c in claims:
        verdict = c.get("verdict") or ("held" if c.get("held") else "not held")
        kind = c.get("kind", "finding")
        if kind == "identity":
            out["identities"]["verified" if verdict == "held" else "failed"] += 1
        elif kind == "check":
            out["checks"][verdict] += 1
        elif supporting(c, names):
            out["supporting"] += 1
    for st in statements(claims, names):
        if st["verdict"] == "untested":
            out["untested"] += 1
        else:
            out["findings"][st["verdict"]] += 1
        out["holm_family"] += st.get("holm", "").startswith(("kept", "held before", "not held before"))
        out["holm_demoted"] += st.get("holm", "").endswith("before Holm")
    return out


#: words a claim's ``source`` must not contain: it names a document and a place in it, or says "our
#: check" / "derived here" (never a tracker issue or our private notes)
_BAD_SOURCES = ("issue", "REFERENCE.md", "seed 0")


def citation_problems(claims: list[dict[str, Any]]) -> list[str]:
    """What a referee would object to in claim dicts (as in claims.json): a finding without a
    quote or a rule, a check without a rule, a source naming an issue or our notes instead of a
    document, a ``supports`` that names no counted finding. A ``supports`` naming another
    reproduction's claim (``decouple.…`` from ``table1.…``) is checked where that reproduction's
    claims are in the list (the combined claims of ``reproduce all``). Empty when all is well."""
    out = []
    by_name = {c["name"]: c for c in claims}
    studies = {c["name"].split(".")[0] for c in claims}
    for c in claims:
        kind = c.get("kind", "finding")
        if kind == "finding" and not c.get("quote"):
            out.append(f"{c['name']}: a finding with no quote of its document")
        if kind in ("finding", "check") and not c.get("rule"):
            out.append(f"{c['name']}: no rule recorded")
        if any(b in (c.get("source") or "") for b in _BAD_SOURCES):
            out.append(f"{c['name']}: source {c.get('source')!r} names an issue or our notes, not a document")
        sup = c.get("supports")
        if sup and sup.split(".")[0] not in studies:
            continue  # another reproduction's finding: checked with the combined claims
        if sup and (sup not in by_name or by_name[sup].get("kind", "finding") != "finding"
                    or by_name[sup].get("supports")):
            out.append(f"{c['name']}: supports {sup!r}, which is not a counted finding of this reproduction")
    return out


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


#: every profile a study may offer, smallest first: ``quick`` (minutes), ``full`` (the default),
#: ``paper`` (the source document's own settings, where a study has them), ``paper_vit`` (fig3's
#: ViT half of ``paper`` alone)
PROFILES = ("quick", "full", "paper", "paper_vit", "designs")


@dataclass(frozen=True)
class Study:
    """A reproduction in four parts (the shape every study has):

    - ``params``: a frozen dataclass with ``quick()`` and ``full()`` classmethods; what ran is
      recorded as ``asdict(params)`` in run.json and rebuilt from there by ``--replot``;
    - ``run(params) -> data``: the experiment, the only slow part; returns JSON-able data;
    - ``claims(data, params) -> list[Claim]``: pure, from the data alone;
    - ``figures(data, params) -> list[FigureOut]``: draws only from the data;
    - ``notes(data, params) -> list[str]`` (optional): prose for the report.

    The runner passes ``claims`` and ``figures`` the data as read back from JSON (lists, None
    for non-finite floats), on a fresh run exactly as on a replot.
    """

    name: str
    title: str
    source: str
    params: type
    run: Callable[[Any], dict[str, Any]]
    claims: Callable[[dict[str, Any], Any], list[Claim]]
    figures: Callable[[dict[str, Any], Any], list[FigureOut]]
    notes: Callable[[dict[str, Any], Any], list[str]] | None = None

    def profiles(self) -> tuple[str, ...]:
        """The profiles this study offers: those of :data:`PROFILES` its params class defines
        as a classmethod (every study has ``quick`` and ``full``)."""
        return tuple(p for p in PROFILES if callable(getattr(self.params, p, None)))

    def make_params(self, profile: str) -> Any:
        """The params of ``profile`` (one of :meth:`profiles`)."""
        offered = self.profiles()
        if not isinstance(profile, str) or profile not in offered:
            raise HeadRankError(f"unknown profile {str(profile)[:40]!r} for {self.name}; use one of "
                                f"{', '.join(offered)}")
        return getattr(self.params, profile)()

    def with_overrides(self, params: Any, overrides: dict[str, Any]) -> Any:
        """``params`` with some fields replaced (a user's ``--model PATH``); unknown fields are
        a user error."""
        names = {f.name for f in fields(self.params)}
        bad = sorted(set(overrides) - names)
        if bad:
            raise HeadRankError(f"reproduction {self.name!r} has no parameter {', '.join(bad)}")
        return replace(params, **overrides)

    def params_from_json(self, d: dict[str, Any]) -> Any:
        """The params dataclass from its recorded ``asdict`` (lists back to tuples)."""
        names = {f.name for f in fields(self.params)}
        unknown = set(d) - names
        if unknown:
            raise HeadRankError(f"recorded parameters of {self.name} have unknown fields {sorted(unknown)}: "
                                "the stored run comes from another version; re-run it")
        return self.params(**{k: _tuples(v) for k, v in d.items()})


def _tuples(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_tuples(x) for x in v)
    if isinstance(v, dict):
        return {k: _tuples(x) for k, x in v.items()}
    return v


@dataclass(frozen=True)
class Entry:
    """A registered reproduction: its :class:`Study`."""

    name: str
    title: str
    source: str
    study: Study


_REGISTRY: dict[str, Entry] = {}


def register_study(study: Study) -> Study:
    """Register ``study`` under ``study.name`` (its module must be in :data:`CATALOGUE`)."""
    prev = _REGISTRY.get(study.name)
    if prev is not None and prev.study.run.__module__ != study.run.__module__:
        raise ValueError(f"reproduction {study.name!r} registered twice")
    _REGISTRY[study.name] = Entry(name=study.name, title=study.title, source=study.source, study=study)
    return study


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
        raise HeadRankError(f"unknown reproduction {name!r}; known: {known}")
    return _REGISTRY[name]
