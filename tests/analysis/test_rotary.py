"""Rotary bands against the real Hugging Face modules: the band decomposition of each head must
sum to the score HF computes with rotary applied (real positions), for rotate_half models with
full (Llama, GQA) and partial rotary (GPT-NeoX rotary_pct, Phi partial_rotary_factor) and for
GPT-J's interleaved pairs; the frequencies must be those of the model's own rotary embedding; the
band energies are checked against dense float64 averages of the formed band forms."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
import transformers as tf
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from headrank.analysis.rotary import (
    COMMUTES,
    DEFAULT_PARTIAL,
    RotarySpec,
    band_energies,
    band_scores,
    energies_from_norms,
    pass_metrics,
    rotary_line,
    rotary_spec,
)
from headrank.analysis.scan import analyze, layer_metrics
from headrank.core.metrics import METRIC_COLUMNS
from headrank.core.product import Product
from headrank.io.checkpoint import Checkpoint
from headrank.io.layouts import AttentionReader

from ..core.test_metrics import dense_reference

CAPTURE = "headrank_rotary_capture"
_captured: dict[int, dict[str, torch.Tensor]] = {}


def _capture(module, query, key, value, attention_mask, **kwargs):
    _captured[id(module)] = {"q": query, "k": key}  # (b, heads, n, dh), rotary applied by HF
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


tf.AttentionInterface.register(CAPTURE, _capture)
SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96, vocab_size=101)

# name: (config, model class, layers path, attention module)
MODELS = {
    "llama_gqa": (lambda: tf.LlamaConfig(**SMALL, num_key_value_heads=2, rope_theta=500.0), tf.LlamaModel,
                  "layers", "self_attn"),
    "gpt_neox_partial": (lambda: tf.GPTNeoXConfig(**SMALL, rotary_pct=0.5, rotary_emb_base=100.0), tf.GPTNeoXModel,
                         "layers", "attention"),
    "phi_partial": (lambda: tf.PhiConfig(**SMALL, partial_rotary_factor=0.75), tf.PhiModel, "layers", "self_attn"),
    "gptj_interleaved": (lambda: tf.GPTJConfig(n_embd=64, n_layer=2, n_head=4, rotary_dim=8, vocab_size=101,
                                               n_positions=64), tf.GPTJModel, "h", "attn"),
}


def _build(name, tmp_path):
    make_cfg, cls, *_ = MODELS[name]
    torch.manual_seed(0)
    model = cls(make_cfg())
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("bias"):
                p.zero_()  # the score forms exclude biases
    model.save_pretrained(tmp_path, safe_serialization=True)
    return cls.from_pretrained(tmp_path, attn_implementation=CAPTURE).double().eval()


def _capture_run(name, model, n=9):
    layers = model.get_submodule(MODELS[name][2])
    caps = [{} for _ in layers]
    hooks = []
    for i, layer in enumerate(layers):
        attn = layer.get_submodule(MODELS[name][3])
        hooks.append(attn.register_forward_pre_hook(
            lambda mod, args, kwargs, i=i: caps[i].update(x=args[0] if args else kwargs["hidden_states"]),
            with_kwargs=True))
        hooks.append(attn.register_forward_hook(lambda mod, args, out, i=i: caps[i].update(_captured.pop(id(mod)))))
    ids = torch.randint(0, 101, (2, n), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(input_ids=ids)  # default positions 0..n-1: the rotation is not the identity
    for h in hooks:
        h.remove()
    return caps


def _weights(name, model, tmp_path, i):
    """(wq (H, dh, d), wk (Hkv, dh, d)): through headrank's own layout reader where the table has
    the architecture, else (GPT-J) from the module's projections."""
    if name.startswith("gptj"):
        attn = model.h[i].attn
        H, dh = attn.num_attention_heads, attn.head_dim
        return (attn.q_proj.weight.detach().reshape(H, dh, -1).double(),
                attn.k_proj.weight.detach().reshape(H, dh, -1).double())
    with Checkpoint(tmp_path) as ckpt:
        hw = AttentionReader(ckpt).read_layer(i)
    return hw.wq.double(), hw.wk.double()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_band_decomposition_sums_to_the_hf_score(name, tmp_path):
    model = _build(name, tmp_path)
    caps = _capture_run(name, model)
    config = json.loads((tmp_path / "config.json").read_text())
    for i, cap in enumerate(caps):
        wq, wk = _weights(name, model, tmp_path, i)
        spec, _ = rotary_spec(config, wq.shape[1])
        assert spec.style == ("interleaved" if name.startswith("gptj") else "half")
        assert spec.rotary_dim < spec.head_dim or name == "llama_gqa"
        x, q, k = cap["x"], cap["q"], cap["k"]
        group = q.shape[1] // k.shape[1]
        n = x.shape[1]
        m_pos, n_pos = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
        for h in range(q.shape[1]):
            hf = q[:, h] @ k[:, h // group].mT  # (b, n, n): HF's score with rotary applied
            parts = band_scores(wq[h], wk[h // group], spec, x[:, :, None, :], x[:, None, :, :],
                                (m_pos - n_pos).double())
            assert parts.shape[-1] == spec.n_bands + 1
            # HF forms cos/sin in float32 (angles to ~1e-7): agreement to float32 round-off, while a
            # rotation the other way round misses by orders of magnitude more
            scale = hf.abs().max().item()
            torch.testing.assert_close(parts.sum(-1), hf, rtol=0, atol=2e-6 * scale)
            wrong = band_scores(wq[h], wk[h // group], spec, x[:, :, None, :], x[:, None, :, :],
                                (n_pos - m_pos).double()).sum(-1)
            assert (wrong - hf).abs().max().item() > 1e-3 * scale
        # at relative position 0 the rotation is the identity: the parts sum to x W_Q^T W_K y
        static = torch.einsum("bid,ed,ef,bjf->bij", x, wq[0], wk[0], x)
        torch.testing.assert_close(band_scores(wq[0], wk[0], spec, x[:, :, None], x[:, None], 0.0).sum(-1), static)


def _rot(phi):
    c, s = np.cos(phi), np.sin(phi)
    return np.array([[c, -s], [s, c]])


def test_band_energies_are_dense_averages_over_the_rotation():
    """e_j is the mean over the band's angle of ‖W_Q[S]ᵀ R(φ) W_K[S]‖²_F (a uniform grid of 8 angles
    integrates these degree-2 trigonometric polynomials exactly); over independent band phases the
    whole form's mean energy is Σ e_j + ‖P‖²_F."""
    rng = np.random.default_rng(0)
    d, dh = 12, 8
    for style in ("half", "interleaved"):
        spec = RotarySpec(dh, 4, style, 10000.0, "default", (1.0, 0.01), "test")
        wq, wk = rng.standard_normal((dh, d)), rng.standard_normal((dh, d))
        bands, rest = band_energies(torch.from_numpy(wq), torch.from_numpy(wk), spec)
        from_norms = energies_from_norms(torch.from_numpy((wq**2).sum(1)), torch.from_numpy((wk**2).sum(1)), spec)
        torch.testing.assert_close(from_norms, bands, rtol=1e-14, atol=0)
        a, b = spec.pairs()
        grid = 2 * np.pi * np.arange(8) / 8
        forms = [[wq[[a[j], b[j]]].T @ _rot(phi) @ wk[[a[j], b[j]]] for phi in grid] for j in range(2)]
        for j in range(2):
            assert bands[j].item() == pytest.approx(np.mean([(f**2).sum() for f in forms[j]]), rel=1e-12)
        p = spec.pass_dims()
        P = wq[p].T @ wk[p]
        assert rest.item() == pytest.approx((P**2).sum(), rel=1e-12)
        whole = [((f0 + f1 + P) ** 2).sum() for f0 in forms[0] for f1 in forms[1]]
        assert np.mean(whole) == pytest.approx(bands.sum().item() + rest.item(), rel=1e-12)


@pytest.mark.parametrize("make", [
    lambda: tf.LlamaConfig(**SMALL, rope_theta=5e5),
    lambda: tf.GPTNeoXConfig(**SMALL),  # transformers' default rotary_pct
    lambda: tf.PhiConfig(**SMALL),  # transformers' default partial_rotary_factor
    lambda: tf.Qwen2Config(**SMALL, rope_theta=1e6),
    lambda: tf.LlamaConfig(**SMALL, max_position_embeddings=16384, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}),
])
def test_frequencies_are_those_of_the_models_own_rotary_embedding(make):
    cfg = make()
    inv = cls_for(cfg)(cfg).rotary_emb.inv_freq.double().numpy()
    saved = json.loads(cfg.to_json_string())  # what config.json holds
    spec, _ = rotary_spec(saved, cfg.hidden_size // cfg.num_attention_heads)
    assert spec.n_bands == len(inv)
    np.testing.assert_allclose(spec.theta, inv, rtol=1e-6)


def cls_for(cfg):
    return {"llama": tf.LlamaModel, "gpt_neox": tf.GPTNeoXModel, "phi": tf.PhiModel, "qwen2": tf.Qwen2Model}[
        cfg.model_type]


def test_old_style_config_keys_and_defaults_follow_transformers():
    """rotary_pct / rotary_emb_base (older GPT-NeoX config.json files) and the defaults a config may
    leave out, against transformers' own config classes."""
    old = {"model_type": "gpt_neox", "rotary_pct": 0.25, "rotary_emb_base": 1000}
    spec, _ = rotary_spec(old, 16)
    assert spec.rotary_dim == 4 and spec.base == 1000.0
    for model_type, factor in DEFAULT_PARTIAL.items():
        hf = tf.AutoConfig.for_model(model_type).rope_parameters["partial_rotary_factor"]
        assert factor == hf
    assert rotary_spec({"model_type": "gguf:llama", "rotary_dim": 8, "rope_theta": 1e4}, 16)[0].rotary_dim == 8
    for bad in ({"partial_rotary_factor": 0.01}, {"rotary_dim": 7}, {"rope_theta": "x"}, {"rope_theta": 0.5}):
        with pytest.raises(ValueError):
            rotary_spec({"model_type": "llama", **bad}, 16)


def test_spectra_writes_rotary_csv_with_the_non_rotary_spectra(tmp_path):
    src = tmp_path / "neox"
    model = _build("gpt_neox_partial", src)
    res = analyze(src)
    rot = res.rotary
    H, L, r = 4, 2, 8
    assert len(rot) == L * H * (r // 2) + L * H and set(rot["part"]) == {"band", "pass"}
    np.testing.assert_allclose(rot.groupby(["layer", "head"])["share"].sum(), 1.0, rtol=1e-12)
    info = res.meta["conventions"]["rotary_bands"]
    assert info["rotary_dim"] == r and info["non_rotary_dims"] == "8..15" and info["commutes_with_rotation"] == COMMUTES
    assert info["commutes_with_rotation"]["rank-k cut of the full W_K^T W_Q of a rotary head"] is False
    # the pass rows carry the metric table of W_K[p]ᵀ W_Q[p], checked against the formed product
    with Checkpoint(src) as ckpt:
        hw = AttentionReader(ckpt).read_layer(1)
    for h in range(H):
        wq, wk = hw.wq[h, r:].double().numpy(), hw.wk[h, r:].double().numpy()
        ref = dense_reference(wk.T, wq.T, res.meta["tolerance"])
        row = rot.query(f"layer == 1 and head == {h} and part == 'pass'").iloc[0]
        assert row["energy"] == pytest.approx((ref["frob"]) ** 2, rel=1e-10)
        for k in METRIC_COLUMNS:
            assert row[k] == pytest.approx(ref[k], rel=1e-8, abs=1e-12 * ref["frob_bound"]), k
    files = res.save(tmp_path / "out", plots=False)
    assert "rotary.csv" in {p.name for p in files}
    back = pd.read_csv(tmp_path / "out" / "rotary.csv")
    assert len(back) == len(rot) and json.loads((tmp_path / "out" / "meta.json").read_text())[
        "conventions"]["rotary_bands"]["bands"] == r // 2
    assert rotary_line(res.meta).startswith("rotary: 8 of 16 dims in 4 bands")
    # the pass part from the scan's roots (Product.restrict: no second read of the weights) = from
    # the weights afresh
    spec, _ = rotary_spec(json.loads((src / "config.json").read_text()), 16)
    layer_metrics(hw)
    p = torch.from_numpy(spec.pass_dims())
    fresh = Product(hw.kv_for_query_heads(hw.wk)[:, p, :].mT, hw.wq[:, p, :].mT).metrics()
    for k in METRIC_COLUMNS:
        torch.testing.assert_close(getattr(pass_metrics(hw, spec), k).double(),
                                   getattr(fresh, k).double(), rtol=1e-9, atol=1e-12)
    off = analyze(src, rotary=False)
    assert rotary_line(off.meta) is None
    assert off.rotary is None and "not measured" in off.meta["conventions"]["rotary_bands"]
    pd.testing.assert_frame_equal(off.table, res.table)
    del model


def test_non_rotary_models_write_no_rotary_table(tmp_path):
    cfg = tf.BertConfig(**SMALL)
    tf.BertModel(cfg).save_pretrained(tmp_path / "bert", safe_serialization=True)
    res = analyze(tmp_path / "bert")
    assert res.rotary is None and res.meta["conventions"]["rotary_bands"] is None
    assert "rotary.csv" not in {p.name for p in res.save(tmp_path / "out", plots=False)}



def test_a_gguf_llama_gives_the_bands_of_its_hf_checkpoint(tmp_path):
    """llama.cpp permutes Q/K rows inside each head (adjacent-pair rotary); the reader undoes it, so
    the bands (and the rope base and width, from the GGUF metadata) are those of the HF checkpoint."""
    gguf = pytest.importorskip("gguf")
    from ..io.test_gguf import _sizes, build_hf, hf_to_gguf_tensors

    model = build_hf("llama", tmp_path / "hf", cfg=tf.LlamaConfig(**SMALL, num_key_value_heads=2, rope_theta=5000.0))
    L, d, H, Hkv, dh = _sizes(model.config)
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    for add, v in ((w.add_block_count, L), (w.add_embedding_length, d), (w.add_head_count, H),
                   (w.add_head_count_kv, Hkv), (w.add_key_length, dh), (w.add_value_length, dh),
                   (w.add_rope_dimension_count, dh)):
        add(v)
    w.add_rope_freq_base(5000.0)
    for name, arr in hf_to_gguf_tensors("llama", model).items():
        w.add_tensor(name, arr.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ours, ref = analyze(tmp_path / "m.gguf"), analyze(tmp_path / "hf")
    assert ours.meta["conventions"]["rotary_bands"]["base"] == ref.meta["conventions"]["rotary_bands"]["base"] == 5000
    np.testing.assert_allclose(ours.rotary["energy"], ref.rotary["energy"], rtol=1e-6)
    np.testing.assert_allclose(ours.rotary["theta"], ref.rotary["theta"], rtol=0)
