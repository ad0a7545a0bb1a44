"""Coverage: every statement of the three source documents that reports an experiment or a
theorem, one sentence each in our words, with the claim that tests it here or the reason none
can. Rendered in the combined report and in docs/METHODS.md (by docs/gallery.py); a test checks
that every claim named here exists in a study and every finding of a study is named here.
"""

from __future__ import annotations

PAPER = "paper (Kobayashi, Akram, von Oswald 2024)"
COLLAPSE = "article on Dong, Cordonnier, Loukas 2021"
SCALE = "article 'Weight Decay is Useless Without Residual Connections'"

#: (document, place, the statement in one sentence, claims that test it (comma-separated; empty
#: when none), why none can here / how far the test goes)
COVERAGE: tuple[tuple[str, str, str, str, str], ...] = (
    (PAPER, "abstract; Prop. 3.1", "For balanced factors (AᵀA = BᵀB) the Frobenius bound equals the nuclear norm, so "
     "L2 on the factors and nuclear norm on the product share their minima.",
     "prop31.balanced_equality, prop31.unbalanced_gap",
     "identities (algebra, verified, not counted among the findings) on random, non-diagonal and rectangular factors "
     "(5×5, 16×4, 64×8, rank-3 8×6); with them the factor form (the minimum of ½(‖A‖² + ‖B‖²) over ABᵀ = W is ‖W‖_*, "
     "reached at balanced factors, with a positive gap otherwise); fig1.soft_threshold, counted under Figure 1 "
     "center right, tests the shared minimum"),
    (PAPER, "abstract", "Any local minimum of the L2-regularised factor loss coincides with a minimum of the "
     "nuclear-norm-regularised one.", "fig1.local_minima",
     "gradient descent on random non-diagonal, rectangular and low-rank targets D (factors of inner size ≥ min(m, n)), "
     "several λ and initialisations; each end point checked to be a local minimum (gradient, Hessian) and compared "
     "with the nuclear-norm optimum from the SVD (singular values soft-thresholded at λ/2 for this loss)"),
    (PAPER, "abstract; Figure 1 left", "Under gradient descent the L2 and nuclear-norm losses become identical "
     "exponentially quickly for λ > 0.", "fig1.gap_decay", ""),
    (PAPER, "abstract", "This explains why the regularisation acts in the early stages of training.",
     "fig2.early_stages", "an explanatory clause: listed as interpretation (our check), never counted as a finding; "
     "measured on the recall task in decay exposure: the relative gap between the Frobenius bound (the L2 term) and "
     "the nuclear norm at exposure 1, against its start and the λ = 0 control"),
    (PAPER, "abstract; TL;DR", "Weight decay significantly reduces the rank of W_KᵀW_Q and P W_V, even in fully "
     "online training.", "designs.online_rank", "judged on online runs only (fresh batches every step): design (b), "
     "recall needing high-rank attention at exposure 8; the quick and full fig3 LMs repeat their data and do not "
     "count here; untested until the designs profile runs"),
    (PAPER, "abstract (Table 1)", "Inducing low rank in the attention products can damage language-model "
     "performance.", "table1.attn_decay_hurts", "a 4-layer byte-level LM, not a Pile LM; the truncation arm "
     "(designs.truncation_arm, low rank without decay, supporting) is designed, not implemented"),
    (PAPER, "abstract (Table 1)", "Decoupling the attention layers' weight decay from the rest of the parameters "
     "has advantages.", "decouple.decoupling_helps, table1.decoupling_helps",
     "judged only where some coupled decay beats none on validation perplexity; decouple runs table1's LM on 20,000 "
     "characters per split (a train/validation gap opens) to find such a regime; where none does, untested; "
     "design (a), designs.decouple_best (best against best), is its supporting evidence in a combined report and "
     "counted itself when run alone"),
    (PAPER, "Lemma 3.2, Theorems 3.3 and 3.4", "Further theorems on the dynamics and minima.", "",
     "not testable: the source text gives only their names, not their statements"),
    (PAPER, "Figure 1 center left", "The imbalance AᵀA − BᵀB vanishes exponentially with a time constant set by λ.",
     "fig1.balance_rate", ""),
    (PAPER, "Figure 1 center right", "The singular values of ABᵀ shrink linearly with λ until they vanish.",
     "fig1.soft_threshold", ""),
    (PAPER, "Figure 1 right", "Singular values of ABᵀ over training at λ = 0.4.", "",
     "a plot without a statement beyond the panels before it (drawn in fig1's figure)"),
    (PAPER, "Figure 2 left", "In a 2-layer transformer on associative recall the rank of P W_V falls as the "
     "attention decay grows.", "fig2.rank_falls", ""),
    (PAPER, "Figure 2 center", "The imbalance ‖PᵀP − W_V W_Vᵀ‖ vanishes under AdamW with a time constant that "
     "follows the decay strength.", "fig2.balance_time_constant",
     "judged on the absolute ‖PᵀP − W_V W_Vᵀ‖_F the panel plots; the relative imbalance (fig2.balance_relative) "
     "supports it; fig2.balance_lasts (supporting fig2.gap_vanishes) records at a long horizon whether the balance "
     "lasts"),
    (PAPER, "Figure 2 right", "The gap between the Frobenius bound and the nuclear norm of P W_V approaches 0.",
     "fig2.gap_vanishes", "judged at a horizon fixed in params"),
    (PAPER, "Figure 2 caption", "The L2 optimisation thus gradually switches to the nuclear-norm one, explaining "
     "the rank regularisation.", "", "an interpretation of the measured panels, no separate measurement"),
    (PAPER, "Figure 2 caption", "The findings are qualitatively identical for W_KᵀW_Q.", "fig2.qk_identical", ""),
    (PAPER, "Figure 3 caption", "In an LM (layer 5, the Pile) and a ViT (ImageNet) the rank of both products falls "
     "as the attention decay grows.", "fig3.rank_falls",
     "CPU-scale LM on the stdlib corpus and ViT on digits, judged once over both (per model in support)"),
    (PAPER, "Figure 3 caption", "Decay 0.1, as used to pretrain large models, noticeably reduces the rank against "
     "no decay.", "fig3.lam01_literal",
     "λ = 0.1 literally in both models; per model, and at the exposure λ = 0.1 has in LLaMA-2-7B pretraining, in "
     "support"),
    (PAPER, "Figure 4 caption", "In LLaMA-2-7B the squared row norms of W_Q and W_K (W_V and P) are mostly equal.",
     "fig4.rows_equal", "not testable here unless --model names a real pretrained checkpoint"),
    (PAPER, "Figure 4 caption", "This indicates that training advanced enough for the balance condition to "
     "emerge.", "fig4.lm.decay_balances", "an interpretation; our check asks the causal question on our own LMs"),
    (PAPER, "Figure 4 caption", "In LLaMA-2-7B the Frobenius bound and the nuclear norm of every head almost "
     "coincide.", "fig4.bound_coincides", "not testable here unless --model names a real pretrained checkpoint"),
    (PAPER, "Figure 5 caption left", "AdamW converges to the optimum of the L2-regularised loss with λ_L2 = λ_wd·ε.",
     "fig5.direct_adamw_reaches_l2_optimum", "judged where λ_wd·ε moves the optimum visibly"),
    (PAPER, "Figure 5 caption right", "With w = a·b both optimisers reach the same, L1-regularised (sparse) point.",
     "fig5.factorized_adamw_reaches_l1_optimum, fig5.optimizers_agree", "two parts, combined by the several-parts "
     "rule and counted once: AdamW's end point against the L1 optimum (Adam + L2 in support), and the two optimisers' "
     "end points against each other (\"the two optimizers find the same convergence point\", at the main point and "
     "where λ_wd·ε moves the optimum; for w directly too, the caption's \"again\")"),
    (COLLAPSE, "Research Paper Focus; §3.1", "Pure self-attention loses rank doubly exponentially with depth.",
     "collapse.cubic_rate, collapse.doubly_exponential", "the rate alone: κ of log r_{L+1} = κ log r_L + c per "
     "network, κ − 1 over independent networks against a declared margin (the fitted form a + b·3^L over the depths "
     "where the stated bound is non-vacuous is supporting evidence)"),
    (COLLAPSE, "§3.1–3.2", "Each path converges to rank one at the stated doubly exponential bound.",
     "collapse.stated_bound", "the stated bound as an inequality with β from the real weights: untested while γ is "
     "undefined in the document (the γ where it turns is reported)"),
    (COLLAPSE, "Research Paper Focus", "The output converges to a rank-one matrix with identical rows.",
     "collapse.pure_attention", ""),
    (COLLAPSE, "Research Paper Focus; §4.1", "Skip connections prevent rank collapse.", "collapse.skip_prevents", ""),
    (COLLAPSE, "Research Paper Focus; §4.2, §5.3", "MLPs slow the convergence by raising the Lipschitz constant.",
     "collapse.mlp_slows, collapse.mlp_lipschitz", "the slowing is judged on MiniLM; the mechanism as a "
     "dose-response: MLP output scale ×0.25…×8 at several init scales and depths, one-sided Spearman per cell"),
    (COLLAPSE, "Research Paper Focus", "Deep SANs with skips act like ensembles of weakly-dependent shallow "
     "networks.", "collapse.short_paths", "judged on trained networks (the recall model, MiniLM's attention + skip "
     "variant): the short paths' share of the output norm and the correlation of the ensemble members' outputs; the "
     "random-init sweep over six init scales supports it (collapse.short_paths_init)"),
    (COLLAPSE, "§2.2", "The SAN output is a sum over paths through heads.", "collapse.path_sum_exact", ""),
    (COLLAPSE, "§3.2", "In multi-head SANs the rate is modulated by the number of heads.", "collapse.heads_modulate",
     "the per-layer constant of r_{l+1} = c·r_l³ from residuals computed past the float64 floor, H = 1 … 8 at a "
     "fixed width; the stated bound's base βH/√d_qk reported beside it"),
    (COLLAPSE, "§4.1", "With skips there are C(L,k)·H^k paths of length k.", "collapse.path_counts", ""),
    (COLLAPSE, "§5.2", "The expressivity of a path falls with its length.", "collapse.path_products", ""),
    (COLLAPSE, "§5.4", "The predictions were validated on BERT, Albert and XLNet.", "",
     "untested: Albert and XLNet are not on this machine; collapse.pure_attention (counted above) runs on MiniLM-L6, "
     "a BERT; `headrank reproduce collapse --model PATH` runs the surgery on another checkpoint the surgery "
     "supports"),
    (SCALE, "Positive Scaling of ReLU Networks", "Scaling a weight matrix (and its bias) of a ReLU network without "
     "LayerNorm scales the output by the same factor.", "scale.homogeneous, scale.homogeneous_bias_free",
     "judged on a network whose later layers have biases (as real networks do); the bias-free algebra is an identity"),
    (SCALE, "TL;DR", "In ReLU networks with LayerNorm and no residual connections weight decay does not change the "
     "optimal loss.", "scale.tldr_identity, scale.optimal_loss_unchanged",
     "an identity at LayerNorm ε = 0 (every W scaled by c → 0, the loss unchanged); what SGD reaches is our check "
     "(≥ 3 seeds), not counted as the statement"),
    (SCALE, "How to Disappear Completely", "With LayerNorm and no residuals every weight can be shrunk without "
     "changing the function.", "scale.shrink_free_none, scale.small_norms_eps", "algebra at ε = 0: an identity; "
     "with the real LayerNorm (ε = 1e-5) a finding: the loss change at c = 0.1, 0.01, 1e-3 against a 0.1 % margin"),
    (SCALE, "How to Disappear Completely", "We can remove the weight decay term and it's not going to matter.",
     "scale.effective_lr_matters", "for the optimum the TL;DR identity; for what SGD does, our check of the "
     "effective learning rate η/|W|² decay sets (reported against the quote, not counted)"),
    (SCALE, "Positive Scaling of ReLU Networks", "Multiplying the input by a positive scalar scales the output by it "
     "(with LayerNorm: leaves it unchanged).", "scale.input_equivariance", "an identity"),
    (SCALE, "How to Disappear Completely", "If the regularisation term goes to zero, the network is free to overfit.",
     "scale.free_to_overfit", "the generalisation gap at the largest λ against λ = 0"),
    (SCALE, "residual connections", "Post-norm residuals keep the scale invariance.", "scale.shrink_free_post", ""),
    (SCALE, "residual connections", "Pre-norm residuals break the scale invariance.", "scale.shrink_costly_pre", ""),
    (SCALE, "closing", "Whether gradient descent finds these solutions is an open question.", "",
     "a question, not a claim; our checks on the training dynamics (scale.*) address it"),
    (SCALE, "note on BatchNorm", "BatchNorm is scale-invariant too and shares the problem.",
     "scale.batchnorm_invariant", "an identity: BatchNorm (batch statistics, ε = 0) after W, W scaled by a > 0"),
    (SCALE, "word of caution", "Optimisation may reach generalising solutions without explicit regularisation.",
     "", "cited work (Neyshabur 2017), no experiment in the article"),
)


def claims_named() -> set[str]:
    """Every claim name the coverage table refers to."""
    return {n.strip() for row in COVERAGE for n in row[3].split(",") if n.strip()}


def row_names(i: int) -> list[str]:
    """The claims row ``i`` names as testing its statement."""
    return [n.strip() for n in COVERAGE[i][3].split(",") if n.strip()]


def row_of(name: str) -> int | None:
    """The index of the one coverage row (statement) that names claim ``name``; None when none
    does. A claim tests one statement: a name in two rows is an error of the table (a test)."""
    rows = [i for i in range(len(COVERAGE)) if name in row_names(i)]
    if len(rows) > 1:
        raise ValueError(f"claim {name} is named by coverage rows {rows}: a claim tests one statement")
    return rows[0] if rows else None


def statement_label(i: int) -> str:
    """A coverage row as a short label: document place, then the claims that test it."""
    doc, place, _, tested, _ = COVERAGE[i]
    return f"{doc.split(' ')[0]} {place} ({tested})"


def markdown() -> str:
    """The coverage table as a Markdown table."""
    lines = ["| document | place | statement | tested by | note |", "| --- | --- | --- | --- | --- |"]
    for doc, place, st, claims, why in COVERAGE:
        tested = ", ".join(f"`{n.strip()}`" for n in claims.split(",") if n.strip()) or "—"
        lines.append(f"| {doc} | {place} | {st} | {tested} | {why} |")
    return "\n".join(lines)
