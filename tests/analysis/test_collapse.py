"""Rank-collapse measures against direct computations; surgery on real HF modules against the
unmodified models (and, for BERT, against an independent hook-based surgery); path counts
against enumeration; the path decomposition of the project's model against explicit paths."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from headrank.analysis import collapse as C
from headrank.errors import HeadRankError
from headrank.models.opener import open_model, resolve, tokenize
from headrank.util.threads import torch_threads


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def rng():
    return np.random.default_rng(0)


# --------------------------------------------------------------------------- measures


def test_norms_match_numpy(rng):
    M = rng.normal(size=(3, 7, 5))
    for i in range(3):
        l1, linf = np.linalg.norm(M[i], 1), np.linalg.norm(M[i], np.inf)
        assert C.matrix_norm(M, "l1")[i] == pytest.approx(l1)
        assert C.matrix_norm(M, "linf")[i] == pytest.approx(linf)
        assert C.matrix_norm(M, "composite")[i] == pytest.approx(math.sqrt(l1 * linf))
        assert C.matrix_norm(M, "fro")[i] == pytest.approx(np.linalg.norm(M[i], "fro"))
    with pytest.raises(HeadRankError):
        C.matrix_norm(M, "l2")


def test_mean_residual_direct(rng):
    X = rng.normal(size=(4, 9, 6)) + rng.normal(size=6)  # a shared offset: partly collapsed
    for norm, ref in (("l1", lambda A: np.abs(A).sum(0).max()), ("linf", lambda A: np.abs(A).sum(1).max()),
                      ("fro", lambda A: np.sqrt((A**2).sum()))):
        got = C.residual(X, norm)
        for i in range(4):
            R = X[i] - np.ones((9, 1)) @ X[i].mean(0, keepdims=True)
            assert got[i] == pytest.approx(ref(R) / ref(X[i]), rel=1e-12)
    comp = C.residual(X, "composite")
    direct = np.sqrt(C.residual(X, "l1") * C.residual(X, "linf"))  # ratio of geometric means
    np.testing.assert_allclose(comp, direct, rtol=1e-12)
    # identical rows: zero residual; scale invariance; torch input
    row = np.ones((5, 1)) @ rng.normal(size=(1, 4))
    assert C.residual(row, "composite") == pytest.approx(0.0, abs=1e-15)
    assert C.residual(3.7 * X, "fro") == pytest.approx(C.residual(X, "fro"))
    np.testing.assert_allclose(C.residual(torch.tensor(X), "l1"), C.residual(X, "l1"))
    assert np.isnan(C.residual(np.zeros((3, 2))))


def test_best_rows_are_minimisers(rng):
    X = rng.normal(size=(7, 4))
    # Frobenius: the mean; l1 (max column abs-sum): the column-wise median, checked per column on a grid
    np.testing.assert_allclose(C.best_row(X, "fro")[0], X.mean(0))
    med = C.best_row(X, "l1")[0]
    grid = np.linspace(-4, 4, 4001)
    for j in range(4):
        col_cost = np.abs(X[:, j][:, None] - grid[None]).sum(0)
        assert np.abs(X[:, j] - med[j]).sum() <= col_cost.min() + 1e-12
    assert C.residual(X, "l1", "best") <= C.residual(X, "l1", "mean") + 1e-15


def test_linf_best_row_closed_form_and_grid(rng):
    x = rng.normal(size=(6, 1))  # d = 1: the midrange, value (max - min) / 2
    assert C.linf_best_row(x)[0] == pytest.approx((x.max() + x.min()) / 2, abs=1e-9)
    X = rng.normal(size=(5, 2))
    xb = C.linf_best_row(X)
    val = np.abs(X - xb).sum(1).max()
    h = 0.01
    g = np.arange(-3, 3, h)
    G = np.stack(np.meshgrid(g, g, indexing="ij"), -1).reshape(-1, 2)
    costs = np.abs(X[None] - G[:, None]).sum(-1).max(-1)
    assert val <= costs.min() + 1e-9  # no grid point beats the LP
    assert costs.min() <= val + 2 * h  # and the grid gets within its resolution (Lipschitz constant d = 2)
    best = C.residual(X, "linf", "best")
    assert best == pytest.approx(val / np.abs(X).sum(1).max())
    comp_best = C.residual(X, "composite", "best")
    assert comp_best <= min(C.residual(X, "composite", "mean"),
                            float(C.matrix_norm(X - np.median(X, 0), "composite") / C.matrix_norm(X, "composite"))) + 1e-12


def test_cosine_effective_and_stable_rank_direct(rng):
    X = rng.normal(size=(6, 5))
    n = X.shape[0]
    cos = [X[i] @ X[j] / np.linalg.norm(X[i]) / np.linalg.norm(X[j]) for i in range(n) for j in range(n) if i != j]
    assert C.cosine_similarity(X) == pytest.approx(np.mean(cos))
    s = np.linalg.svd(X, compute_uv=False)
    p = s / s.sum()
    one = np.outer(rng.normal(size=6), rng.normal(size=5))
    Q = np.linalg.qr(rng.normal(size=(8, 4)))[0]
    m = C.token_measures(np.stack([X, one]))  # the ranks through the core's one definition, on X's spectrum
    assert list(m) == list(C.MEASURES) and all(v.shape == (2,) for v in m.values())
    assert m["effective_rank"][0] == pytest.approx(np.exp(-(p * np.log(p)).sum()))
    assert m["stable_rank"][0] == pytest.approx((s**2).sum() / s[0] ** 2)
    assert m["effective_rank"][1] == pytest.approx(1.0, abs=1e-6) and m["stable_rank"][1] == pytest.approx(1.0)
    assert C.cosine_similarity(np.outer(np.abs(rng.normal(size=4)) + 0.1, rng.normal(size=3))) == pytest.approx(1.0)
    mq = C.token_measures(Q)
    assert mq["effective_rank"] == pytest.approx(4.0) and mq["stable_rank"] == pytest.approx(4.0)
    assert not hasattr(C, "effective_rank") and not hasattr(C, "stable_rank")  # no second definition


# --------------------------------------------------------------------------- paths


def test_path_counts_against_enumeration():
    for L in range(0, 5):
        for H in range(1, 4):
            counts = [0] * (L + 1)
            for p in C.enumerate_paths(L, H):
                counts[sum(h is not None for h in p)] += 1
            assert C.path_counts(L, H) == counts
            assert sum(C.path_counts(L, H)) == (H + 1) ** L
    st = C.path_length_stats(6, 12)
    c = C.path_counts(6, 12)
    assert st["mean_length"] == pytest.approx(sum(k * v for k, v in enumerate(c)) / sum(c))
    assert st["log10_total_paths"] == pytest.approx(math.log10(13**6))
    t = C.path_table()
    assert set(C.WELL_KNOWN) == set(t.model) and (t.mean_length < t.layers).all()
    with pytest.raises(HeadRankError):
        C.path_counts(3, 0)


def test_path_products_direct(rng):
    L, H, n = 2, 2, 5
    P = rng.random((L, H, n, n))
    P /= P.sum(-1, keepdims=True)
    df = C.path_products(P, n_samples=100)
    assert (df.groupby("length").size().to_dict()) == {0: 1, 1: 4, 2: 4}  # all paths enumerated
    row = df[(df.length == 2) & (df.path == "0.1 1.0")].iloc[0]
    assert row.residual == pytest.approx(float(C.residual(P[1, 0] @ P[0, 1])))
    assert df.residual[0] == pytest.approx(2 * (n - 1) / n)  # identity: composite residual 2(n-1)/n
    big = C.path_products(np.broadcast_to(P[:1], (6, H, n, n)), n_samples=3)
    assert big.groupby("length").size().max() == 3


@pytest.mark.slow
def test_path_restricted_sums_to_output_and_matches_explicit_paths():
    from headrank.models.transformer import Transformer

    ids = C.byte_batch(3, 12)
    for norm in ("none", "pre", "post"):
        torch.manual_seed(1)
        m = Transformer(C.pure_attention_config(3, 0.3, d_model=16, n_heads=2, skip=True, norm=norm)).double().eval()
        out = C.path_restricted(m, ids)
        assert out["sum_rel_error"] < 1e-12, norm
    # norm = none: every path written out, P_{l,h} Z W_v,h^T O_h^T per head on the path
    torch.manual_seed(2)
    m = Transformer(C.pure_attention_config(3, 0.3, d_model=16, n_heads=2, skip=True)).double().eval()
    out = C.path_restricted(m, ids)
    with torch.no_grad():
        _, hidden = m(ids, return_hidden=True)
        probs = [b.attn.attention_probs(x) for b, x in zip(m.blocks, hidden[:-1], strict=True)]
        dh = m.config.head_dim
        explicit = [torch.zeros_like(hidden[0]) for _ in range(4)]
        for path in C.enumerate_paths(3, 2):
            Z = hidden[0]
            for layer, h in enumerate(path):
                if h is None:
                    continue
                a = m.blocks[layer].attn
                Wv, Wo = a.v.weight[h * dh:(h + 1) * dh], a.o.weight[:, h * dh:(h + 1) * dh]
                Z = probs[layer][:, h] @ Z @ Wv.T @ Wo.T
            explicit[sum(h is not None for h in path)] += Z
    for k in range(4):
        torch.testing.assert_close(out["Y"][k], explicit[k], rtol=1e-10, atol=1e-12)
    with pytest.raises(HeadRankError):
        C.path_restricted(Transformer(C.pure_attention_config(2, 0.3, d_model=16, n_heads=2)), ids)


# --------------------------------------------------------------------------- depth fits


def test_fit_depth_recovers_forms():
    L = np.arange(6.0)
    y = 0.5 - 0.2 * 3.0**L
    f = C.fit_depth(L, y)
    assert f["dexp"]["kappa"] == pytest.approx(3.0, abs=0.02) and f["dexp"]["r2"] > 0.99999
    assert f["dexp3"]["r2"] == pytest.approx(1.0) and f["exp"]["r2"] < 0.95
    f = C.fit_depth(L, 1.0 - 0.7 * L)
    assert f["exp"]["r2"] == pytest.approx(1.0) and f["exp"]["b"] == pytest.approx(-0.7)
    assert f["dexp3"]["r2"] < 1 - 1e-3
    assert C.fit_depth(L[:3], y[:3]) == {"n_points": 3, "fitted": False}


def test_depth_sweep_small():
    """The sweep's curves are the exact residuals of each seed's network, averaged; the head-count
    sweep holds the same networks' residuals per head count."""
    from headrank.analysis.collapse.exact import san_residuals

    sw = C.depth_sweep(n_layers=4, init_stds=(0.3,), seeds=(0, 1), n_seqs=3, length=16, d_model=16, n_heads=2)
    c = sw["curves"]["0.3"]
    ids = C.byte_batch(3, 16)
    runs = [san_residuals(C.san_model(4, 0.3, s, 16, d_model=16, n_heads=2), ids) for s in (0, 1)]
    rel = np.concatenate([r["log10_rel"] for r in runs])
    np.testing.assert_allclose(c["log10_rel_mean"], rel.mean(0), rtol=1e-12)
    np.testing.assert_allclose(c["bound"]["log10_abs_res"], np.concatenate([r["log10_abs"] for r in runs]))
    assert c["log10_rel_mean"][0] > c["log10_rel_mean"][-1] and c["bound"]["exact"] and c["exact_share"][-1] == 1.0
    assert c["log10_rel_mean"][-1] < -16 < c["log10_rel_float64_mean"][-1]  # past the float64 floor
    hs = C.heads_sweep((1, 2), (0.3,), (0,), n_layers=4, n_seqs=3, length=16, d_model=16)
    np.testing.assert_allclose(hs["runs"]["0.3/2/0"]["log10_abs"], runs[0]["log10_abs"], rtol=1e-12)
    assert hs["runs"]["0.3/1/0"]["d_qk"] == 16 and len(hs["runs"]["0.3/1/0"]["betas"]) == 4


# --------------------------------------------------------------------------- surgery on real models


@pytest.fixture(scope="module")
def minilm_loaded():
    return open_model("minilm", n_inputs=0)


@pytest.fixture(scope="module")
def minilm_ids(minilm_loaded, sentences):
    ids, desc = tokenize(sentences[:2], minilm_loaded.path, minilm_loaded.vocab_size, 40)
    assert "tokenizer.json" in desc and ids[0][0] == 101  # [CLS] from BERT's own tokenizer
    return [torch.tensor([i]) for i in ids]


def test_minilm_full_variant_equals_hf_hidden_states(minilm_loaded, minilm_ids):
    ad = C.make_adapter(minilm_loaded, "pretrained", 0)
    for ids in minilm_ids:
        cap = ad.reference(ids)
        full = C.run_variant(ad, cap, "full")
        assert len(full) == 7 == len(cap["hidden_states"])
        for ours, hf in zip(full, cap["hidden_states"], strict=True):
            torch.testing.assert_close(ours, hf, rtol=1e-12, atol=1e-12)
        pure = C.run_variant(ad, cap, "pure")
        assert (pure[-1] - full[-1]).abs().max() > 0.1  # surgery changed something


def _bert_hook_surgery(model, ids, skip: bool, mlp: bool):
    """Independent surgery through forward hooks on the unmodified BERT forward."""
    hooks = []
    for layer in model.encoder.layer:
        if not skip:  # LN(dense(h) + input) -> LN(dense(h) + 0)
            for mod in (layer.attention.output, layer.output) if mlp else (layer.attention.output,):
                hooks.append(mod.register_forward_pre_hook(lambda m, a: (a[0], torch.zeros_like(a[1]))))
        if not mlp:  # the MLP sublayer returns its input (the attention sublayer's output)
            hooks.append(layer.output.register_forward_hook(lambda m, a, o: a[1]))
    try:
        with torch.no_grad():
            return model(input_ids=ids, output_hidden_states=True).hidden_states
    finally:
        for h in hooks:
            h.remove()


@pytest.mark.slow
@pytest.mark.parametrize("init", ["pretrained", "random"])
def test_minilm_variants_equal_hook_surgery(minilm_loaded, minilm_ids, init):
    ad = C.make_adapter(minilm_loaded, init, 3)
    ids = minilm_ids[0]
    cap = ad.reference(ids)
    for variant, (skip, mlp) in C.VARIANT_SWITCHES.items():
        ours = C.run_variant(ad, cap, variant)
        ref = _bert_hook_surgery(ad.model, ids, skip, mlp)
        for a, b in zip(ours, ref, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.slow
def test_random_init_is_seeded_and_differs(minilm_loaded):
    a, b, c = (C.make_adapter(minilm_loaded, "random", s).model for s in (5, 5, 6))
    w = "encoder.layer.0.attention.self.query.weight"
    sa, sb, sc = (m.state_dict()[w] for m in (a, b, c))
    assert torch.equal(sa, sb) and not torch.equal(sa, sc)
    assert not torch.equal(sa, C.make_adapter(minilm_loaded, "pretrained", 0).model.state_dict()[w])
    assert float(sa.std()) == pytest.approx(0.02, rel=0.05)  # BERT's initializer_range


def _tiny(tmp_path, name):
    import transformers as tf

    torch.manual_seed(0)
    if name == "gpt2":
        m = tf.GPT2Model(tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=300, n_positions=64))
    else:
        m = tf.LlamaModel(tf.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=48, vocab_size=300))
    d = tmp_path / name
    m.save_pretrained(d)
    return d


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_prenorm_full_variant_equals_hf(tmp_path, name):
    lm = open_model(_tiny(tmp_path, name), n_inputs=0)
    ad = C.make_adapter(lm, "pretrained", 0)
    ids, desc = tokenize(["Real text from the standard library corpus, as bytes."], lm.path, lm.vocab_size, 24)
    assert "UTF-8 bytes" in desc
    ids = torch.tensor(ids)
    cap = ad.reference(ids)
    full = C.run_variant(ad, cap, "full")
    hs = cap["hidden_states"]
    for i in range(ad.n_layers):  # HF's last entry has the final norm applied
        torch.testing.assert_close(full[i], hs[i], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(full[i + 1], cap["outputs"][i], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ad.final_norm(full[-1]), hs[-1], rtol=1e-12, atol=1e-12)
    # first layer, attention only: exactly the attention module's output inside the unmodified forward
    layer = ad.layers[0]
    attn = layer.attn if name == "gpt2" else layer.self_attn
    got = {}
    h = attn.register_forward_hook(lambda m, a, o: got.update(o=o[0]))  # returns None: output unchanged
    ad.reference(ids)
    h.remove()
    torch.testing.assert_close(C.run_variant(ad, cap, "pure")[1], got["o"], rtol=1e-12, atol=1e-12)


def test_training_run_directory_loads_its_newest_checkpoint(tmp_path):
    from headrank.io.rundir import latest_checkpoint
    from headrank.training.config import recall_config
    from headrank.training.loop import train

    cfg = recall_config(steps=2, n_layers=1, d_model=16, n_heads=2, n_pairs=2, n_keys=4, n_values=4,
                        batch_size=4, checkpoint_every=1, track_every=1, log_every=1)
    train(tmp_path / "run", cfg, device="cpu", tensorboard=False)
    path, cfg_json = resolve(tmp_path / "run")
    assert path == latest_checkpoint(tmp_path / "run") and path.name.endswith("2")
    assert cfg_json["model_type"] == "headrank"


def test_project_model_variants(tmp_path):
    from headrank.models.transformer import ModelConfig, Transformer

    torch.manual_seed(0)
    m = Transformer(ModelConfig(vocab_size=256, max_seq_len=32, n_layers=2, d_model=16, n_heads=2))
    m.save_pretrained(tmp_path / "model")
    lm = open_model(tmp_path / "model", n_inputs=0)
    assert lm.model_type == "headrank"
    ad = C.make_adapter(lm, "pretrained", 0)
    ids = C.byte_batch(1, 20)
    cap = ad.reference(ids)
    for a, b in zip(C.run_variant(ad, cap, "full"), cap["hidden_states"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    nomlp = tmp_path / "nomlp"
    Transformer(ModelConfig(vocab_size=256, max_seq_len=32, n_layers=2, d_model=16, n_heads=2,
                            mlp=False)).save_pretrained(nomlp)
    res = C.analyze(nomlp, n_seqs=2, max_tokens=16, path_samples=2, texts=["A first short sentence of text.",
                                                                            "And a second one, long enough."])
    assert res.meta["variants"] == ["pure", "skip"] and res.meta["variants_unavailable"] == ["mlp", "full"]
    pr = res.meta["path_restricted"]
    assert pr["available"] and pr["sum_rel_error"] < 1e-12 and len(pr["residual_by_length"]) == 3


@pytest.mark.slow
def test_analyze_end_to_end(tmp_path, sentences):
    res = C.analyze("minilm", n_seqs=2, max_tokens=24, path_samples=4, texts=sentences[:3], inits=("pretrained",))
    t = res.table
    assert len(t) == 4 * 7 * len(C.MEASURES)
    first = t[(t.layer == 0) & (t.measure == C.PRIMARY)]
    assert first["mean"].nunique() == 1  # every variant starts from the same embedding output
    # the full variant's measure equals the measure of HF's own hidden states
    lm = open_model("minilm", n_inputs=0)
    ids, _ = tokenize(res.meta["texts"][:1], lm.path, lm.vocab_size, 24)
    with torch.no_grad():
        hs = lm.model(input_ids=torch.tensor(ids), output_hidden_states=True).hidden_states
    direct = C.residual(torch.stack([h[0] for h in hs]), "composite")
    np.testing.assert_allclose(res.values["pretrained/full"][0, :, C.MEASURES.index(C.PRIMARY)], direct, rtol=1e-12)
    s = res.summary()
    assert list(s.variant) == list(C.SURGERY_VARIANTS)
    ps = res.path_summary()
    assert list(ps.length) == list(range(7)) and ps.n_paths.tolist() == C.path_counts(6, 12)
    files = C.save(res, tmp_path / "out")
    assert {p.name for p in files} >= {"layers.csv", "summary.csv", "paths.csv", "collapse.npz", "meta.json",
                                       "collapse_layers.png", "path_products.png"}
    assert json.loads((tmp_path / "out" / "meta.json").read_text())["n_layers"] == 6
    with np.load(tmp_path / "out" / "collapse.npz") as z:
        assert z["pretrained__full"].shape == (2, 7, len(C.MEASURES))


def test_user_errors(tmp_path):
    with pytest.raises(HeadRankError, match="no such file"):
        C.analyze(tmp_path / "missing")
    bad = tmp_path / "t5"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(HeadRankError, match="does not support model_type 't5'"):
        C.analyze(bad)
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(HeadRankError, match="without a complete checkpoint"):
        C.analyze(tmp_path / "run")
    with pytest.raises(HeadRankError, match="unknown variant"):
        C.analyze("minilm", variants=("nope",))
    with pytest.raises(HeadRankError):
        C.analyze("minilm", n_seqs=1)


def test_surgery_modules_come_from_the_layout_table():
    from headrank.io.layouts import layout_for

    assert C.surgery_modules({"model_type": "bert"}) is layout_for({"model_type": "bert"}).modules
    assert C.surgery_modules({"model_type": "headrank"}) is None
    with pytest.raises(HeadRankError, match="not 'ViT'"):
        C.surgery_modules({"model_type": "headrank", "architecture": "ViT"})
    for mt in ("gemma", "vit", "t5"):  # in the table without modules, or not at all
        with pytest.raises(HeadRankError, match="does not support"):
            C.surgery_modules({"model_type": mt})
    assert {"bert", "roberta", "gpt2", "llama", "mistral", "qwen2", "headrank"} <= set(C.collapse_model_types())


@pytest.mark.slow
def test_cli_collapse(tmp_path):
    from typer.testing import CliRunner

    from headrank.cli import app

    r = CliRunner().invoke(app, ["collapse", "minilm", "--seqs", "2", "--max-tokens", "12", "--threads", "1",
                                 "--json", "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    payload = json.loads(r.stdout)
    assert len(payload["summary"]) == 8 and (tmp_path / "o" / "layers.csv").exists()
    r = CliRunner().invoke(app, ["collapse", str(tmp_path / "nothing")])
    assert r.exit_code == 2 and "no such file" in r.output and "Traceback" not in r.output
