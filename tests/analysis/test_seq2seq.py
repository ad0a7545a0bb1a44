"""Encoder-decoders: encoder self-, decoder self- and cross-attention as three kinds of layer.

The generated rows (src/headrank/io/layouts_generated.json) are checked against each model's own
eager attention, independently of the discovery code's recording attention: a tiny random model
of the type is run with ``output_attentions``; hooks keep each attention module's inputs (the
hidden states, and for cross-attention the encoder's output) and outputs. The per-head products
read through the generated layout must give

- QK: the module's attention probabilities = softmax(scale · x_q W_Q,hᵀ W_K,h x_kᵀ + bias + mask),
  with the scale each model is known for (T5: 1, no 1/√dh; BART, Whisper, …: 1/√dh) and T5's
  relative position bias as the module returns it (the product is the content term of the score);
- OV: the module's output, ``Σ_h P_h W_V,h Σ_j p_hij x_k,j`` (biases zeroed).

Then the tables: spectra of a checkpoint written by ``save_pretrained`` (local, ``--remote``,
``track``) against dense float64 SVDs of products formed from the model's own weights.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
import transformers as tf
from torch import nn

from headrank.analysis.discover import tiny_config
from headrank.analysis.discover_seq2seq import TINY_S2S, auto_class_seq2seq
from headrank.core.metrics import energy_name
from headrank.errors import HeadRankError
from headrank.io.generated import generated_rows
from headrank.io.layouts import AttentionReader, layout_for
from headrank.io.live import LiveCheckpoint

#: the scale of q·k each model's paper and code use (T5 has none)
SCALE_IS_ONE = {"t5", "mt5", "umt5", "longt5", "switch_transformers", "pop2piano"}
FAST = ["t5", "whisper"]
MORE = ["bart", "marian", "mbart", "pegasus", "m2m_100", "mt5", "umt5", "switch_transformers", "blenderbot",
        "blenderbot-small", "plbart", "speech_to_text", "nllb-moe", "pop2piano", "seamless_m4t"]


def _tiny(mt: str):
    have = tf.AutoConfig.for_model(mt).to_dict()
    over = {k: v for k, v in TINY_S2S.items() if isinstance(have.get(k), int)}
    if "num_mel_bins" in have:
        over["max_source_positions"] = 7
    cfg = tiny_config(mt, over)
    torch.manual_seed(0)
    model = auto_class_seq2seq(mt).from_config(cfg, attn_implementation="eager", dtype=torch.float64).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("bias") and p.dim() == 1:
                p.zero_()
    return model, cfg


def _inputs(model, cfg) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    dec = torch.randint(3, 100, (2, 5), generator=g)
    if model.main_input_name == "input_ids":
        return {"input_ids": torch.randint(3, 100, (2, 7), generator=g), "decoder_input_ids": dec}
    d = cfg.to_dict()
    if "num_mel_bins" in d:  # Whisper: (batch, mel bins, 2 x max_source_positions frames)
        return {"input_features": torch.randn(2, d["num_mel_bins"], 14, generator=g, dtype=torch.float64),
                "decoder_input_ids": dec}
    feats = d["input_feat_per_channel"] * d.get("input_channels", 1)  # Speech2Text: (batch, frames, features)
    return {"input_features": torch.randn(2, 14, feats, generator=g, dtype=torch.float64), "decoder_input_ids": dec}


def _modules(model: nn.Module, pattern: str) -> dict[int, nn.Module]:
    att = pattern.rsplit(".", 1)[0]  # e.g. encoder.block.{i}.layer.0.SelfAttention
    pre, post = att.split("{i}")
    out = {}
    for name, m in model.named_modules():
        for p in (pre, getattr(model, "base_model_prefix", "") + "." + pre):
            if name.startswith(p) and name.endswith(post) and name[len(p): len(name) - len(post)].isdigit():
                out[int(name[len(p): len(name) - len(post)])] = m
    return out


def _bias(mod: nn.Module, out: tuple, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
    """The relative position bias the module added to its scores: T5 returns it (zeros where it has
    none); UMT5 computes its own in every layer (``compute_bias``); the others have none."""
    if isinstance(out, tuple) and len(out) == 3:
        return out[1]
    if getattr(mod, "has_relative_attention_bias", False):
        with torch.no_grad():
            return mod.compute_bias(x.shape[1], y.shape[1])
    return None


def _check(mt: str) -> dict[str, float]:
    row = generated_rows()[mt]
    assert row["status"] == "verified" and row.get("parts"), row.get("reason")
    model, cfg = _tiny(mt)
    reader = AttentionReader(LiveCheckpoint(model, cfg.to_dict()))  # the row layout_for picks
    assert [p.layout.attention for p in reader.parts] == ["encoder", "decoder", "cross"]
    seen: dict[tuple[str, int], dict] = {}
    hooks = []
    for part in row["parts"]:
        for i, m in _modules(model, part["modules"]["q"]).items():
            def hook(mod, args, kw, out, key=(part["attention"], i)):
                x = kw.get("hidden_states", args[0] if args else None)
                y = next((kw[k] for k in ("key_value_states", "encoder_hidden_states") if kw.get(k) is not None), x)
                seen[key] = {"x": x, "y": y, "out": out[0], "p": out[-1], "bias": _bias(mod, out, x, y)}
            hooks.append(m.register_forward_hook(hook, with_kwargs=True))
    with torch.no_grad():
        model(**_inputs(model, cfg), output_attentions=True, use_cache=False)
    for h in hooks:
        h.remove()
    err = {"qk": 0.0, "ov": 0.0}
    for part in reader.parts:
        kind = part.layout.attention
        assert part.layer_ids == sorted(i for k, i in seen if k == kind)
        for i in part.layer_ids:
            hw, s = part.read_layer(i), seen[(kind, i)]
            a, b = hw.qk_factors()
            scale = 1.0 if mt in SCALE_IS_ONE else hw.wq.shape[1] ** -0.5
            logits = torch.einsum("bmd,hde,hfe,bnf->bhmn", s["x"], b, a, s["y"]) * scale
            if s["bias"] is not None:  # T5's relative position bias (zeros for cross-attention)
                logits = logits + s["bias"]
            if kind == "decoder":
                n = logits.shape[-1]
                logits = logits.masked_fill(~torch.tril(torch.ones(n, n, dtype=torch.bool)), float("-inf"))
            err["qk"] = max(err["qk"], float((torch.softmax(logits, -1) - s["p"]).abs().max()))
            ctx = torch.einsum("bhmn,bnd->bhmd", s["p"], s["y"])
            pa, pb = hw.ov_factors()
            pred = torch.einsum("bhmd,hde,hfe->bmf", ctx, pb, pa)
            err["ov"] = max(err["ov"], float((pred - s["out"]).abs().max() / s["out"].abs().max()))
    assert len(seen) == sum(len(p.layer_ids) for p in reader.parts)
    return err


@pytest.mark.parametrize("mt", FAST)
def test_seq2seq_layout_matches_forward(mt):
    err = _check(mt)
    # the eager softmax of these models runs in float64 here; the probabilities are compared directly
    assert err["qk"] < 1e-9 and err["ov"] < 1e-9, f"{mt}: {err}"


@pytest.mark.slow
@pytest.mark.parametrize("mt", MORE)
def test_seq2seq_layout_matches_forward_more(mt):
    err = _check(mt)
    assert err["qk"] < 1e-9 and err["ov"] < 1e-9, f"{mt}: {err}"


def test_t5_row_records_no_scaling_and_its_position_bias():
    parts = {p["attention"]: p for p in generated_rows()["t5"]["parts"]}
    for kind in ("encoder", "decoder", "cross"):
        assert parts[kind]["scaling"] == 1.0 and parts[kind]["qk_factor"] == 1.0  # no 1/sqrt(dh)
        assert parts[kind]["modules"]["k"].startswith("decoder." if kind != "encoder" else "encoder.")
    assert parts["encoder"]["position"] == parts["decoder"]["position"] == "relative_bias"
    assert parts["cross"]["position"] == "none"
    whisper = {p["attention"]: p for p in generated_rows()["whisper"]["parts"]}
    assert all(p["score_scale_times_sqrt_head_dim"] == 1.0 for p in whisper.values())  # 1/sqrt(dh), on q


# -- the tables ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def t5_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("seq2seq")
    out = {}
    for step in (10, 20):
        model, _ = _tiny("t5")
        with torch.no_grad():
            for n, p in model.named_parameters():  # the second checkpoint: cross-attention queries of lower rank
                if step == 20 and "EncDecAttention.q" in n:
                    p[:, 8:] = 0
        d = root / "t5 run" / f"checkpoint-{step}"
        model.save_pretrained(d)
        out[step] = (d, model)
    return root, out


def _dense(w_k: torch.Tensor, w_q: torch.Tensor) -> np.ndarray:
    return np.linalg.svd(w_k.detach().double().numpy().T @ w_q.detach().double().numpy(), compute_uv=False)


def test_spectra_of_a_saved_t5_against_dense_svd(t5_dirs):
    import headrank

    _, dirs = t5_dirs
    d, model = dirs[20]
    res = headrank.spectra(str(d))
    t = res.table
    assert list(t.columns[:2]) == ["attention", "layer"]
    assert list(dict.fromkeys(t["attention"])) == ["encoder", "decoder", "cross"]
    assert t.groupby("attention")["layer"].nunique().to_dict() == {"encoder": 3, "decoder": 2, "cross": 2}
    dh = model.config.d_kv
    for kind, att in (("encoder", model.encoder.block[2].layer[0].SelfAttention),
                      ("decoder", model.decoder.block[1].layer[0].SelfAttention),
                      ("cross", model.decoder.block[1].layer[1].EncDecAttention)):
        layer = 2 if kind == "encoder" else 1
        for h in (0, 4):
            rows = slice(h * dh, (h + 1) * dh)
            qk = _dense(att.k.weight[rows], att.q.weight[rows])[:dh]
            ov = np.linalg.svd(att.o.weight[:, rows].detach().numpy() @ att.v.weight[rows].detach().numpy(),
                               compute_uv=False)[:dh]
            np.testing.assert_allclose(res[kind, layer, h, "qk"].S, qk, rtol=1e-10, atol=1e-14)
            np.testing.assert_allclose(res[kind, layer, h, "ov"].S, ov, rtol=1e-10, atol=1e-14)
    # cross-attention's queries were cut to 8 input dims: rank 8, while its keys kept theirs
    assert (t[(t["attention"] == "cross") & (t["product"] == "qk")]["rank"] == 8).all()
    s = res.summary()
    assert list(s.columns[:3]) == ["attention", "layer", "product"] and len(s) == 2 * 7
    with pytest.raises(HeadRankError, match="res\\[attention, layer, head, product\\]"):
        res[0, 0, "qk"]
    with pytest.raises(HeadRankError, match="attention 'self' was not analysed"):
        res["self", 0, 0, "qk"]
    assert res.describe()[["attention", "layer"]].values.tolist()[-1] == ["cross", 1]


def _energy_rank(s: np.ndarray, level: float) -> int:
    e = np.cumsum(s**2)
    return int(np.searchsorted(e, level * e[-1] * (1 - 1e-12)) + 1)


def test_t5_gets_every_column_and_energy_level_of_other_models(t5_dirs, minilm_dir):
    """An encoder-decoder's table has a decoder-only's columns (random baseline, precision, k999)
    and the asked --energy levels, counted against dense float64 SVDs of the model's own weights."""
    import headrank

    _, dirs = t5_dirs
    d, model = dirs[20]
    res = headrank.spectra(str(d), energy="0.5,0.95", precision="float64")
    t = res.table
    plain = headrank.spectra(minilm_dir, layers="0", energy="0.5,0.95").table
    assert list(t.columns) == ["attention", *plain.columns]
    assert t["k50"].dtype == np.int64 and res.meta["conventions"]["k95"].startswith("energy rank")
    dh = model.config.d_kv
    for kind, layer, att in (("encoder", 2, model.encoder.block[2].layer[0].SelfAttention),
                             ("cross", 1, model.decoder.block[1].layer[1].EncDecAttention)):
        for h in (0, 4):
            rows = slice(h * dh, (h + 1) * dh)
            s = _dense(att.k.weight[rows], att.q.weight[rows])[:dh]
            row = t[(t["attention"] == kind) & (t["layer"] == layer) & (t["head"] == h) & (t["product"] == "qk")]
            for level in (0.5, 0.9, 0.95, 0.99, 0.999):
                assert int(row[energy_name(level)].iloc[0]) == _energy_rank(s, level), (kind, h, level)


def run_cli(*args, cwd):
    env = dict(os.environ, HF_HUB_OFFLINE="1", COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "headrank", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)


def test_cli_spectra_track_and_compress_of_t5(t5_dirs):
    root, _ = t5_dirs
    r = run_cli("spectra", "t5 run/checkpoint-10", "--out", "out t5", "--no-plots", cwd=root)
    assert r.returncode == 0, r.stderr
    assert "encoder 2" in r.stdout and "cross 1" in r.stdout and "layers=encoder 3/decoder 2/cross 2" in r.stdout
    heads = pd.read_csv(root / "out t5" / "heads.csv")
    summary = pd.read_csv(root / "out t5" / "summary.csv")
    assert heads["attention"].value_counts().to_dict() == {"encoder": 36, "decoder": 24, "cross": 24}
    assert summary[["attention", "layer"]].drop_duplicates().shape[0] == 7
    meta = json.loads((root / "out t5" / "meta.json").read_text())
    assert set(meta["conventions"]["attention_kinds"]) == {"encoder", "decoder", "cross"}
    assert "encoder's output" in meta["conventions"]["attention_kinds"]["cross"]
    r = run_cli("track", "t5 run", "--out", "track out", "--no-plots", cwd=root)
    assert r.returncode == 0, r.stderr
    s = pd.read_csv(root / "track out" / "summary.csv")
    assert len(s) == 2 * 7 * 2  # checkpoints x (kind, layer) x products
    cross = s[(s["attention"] == "cross") & (s["product"] == "qk")].groupby("step")["rank"].mean()
    assert cross[10] == 16 and cross[20] == 8
    r = run_cli("compress", "t5 run/checkpoint-10", "--out", "cut", "--keep", "0.9", cwd=root)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "encoder-decoder" in r.stderr and not (root / "cut").exists()


def test_cli_spectra_of_t5_with_figures_and_its_summary(t5_dirs):
    """The figures of an encoder-decoder (its kinds' layers on one axis), and summary.csv against
    pandas' own grouped means of heads.csv, kinds in the model's order."""
    root, _ = t5_dirs
    r = run_cli("spectra", "t5 run/checkpoint-20", "--out", "fig t5", cwd=root)
    assert r.returncode == 0, r.stderr
    out = root / "fig t5"
    assert all((out / f).stat().st_size > 0 for f in ("singular_values.png", "fig4_norms.png", "fig4_rows.png"))
    heads = pd.read_csv(out / "heads.csv")
    summary = pd.read_csv(out / "summary.csv")
    heads["rank_frac"] = heads["rank"] / heads["head_dim"]
    kinds = pd.Categorical(heads["attention"], categories=["encoder", "decoder", "cross"])
    ref = heads.assign(attention=kinds).groupby(["attention", "layer", "product"], observed=True, sort=True)
    ref = ref[["rank_frac", "effective_rank"]].mean().reset_index()
    assert summary["attention"].tolist() == ref["attention"].astype(str).tolist()
    np.testing.assert_allclose(summary[["rank_frac", "effective_rank"]].to_numpy(),
                               ref[["rank_frac", "effective_rank"]].to_numpy(), rtol=1e-15)


def test_remote_t5_equals_local(t5_dirs, monkeypatch):
    import huggingface_hub.constants as hc

    import headrank
    from headrank.io import remote
    from tests.io.hubserver import HubServer

    root, dirs = t5_dirs
    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(remote, "BACKOFF_S", 0.0)
    with HubServer(root=root) as srv:
        srv.add("org/t5", "main", dirs[10][0])
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        far = headrank.spectra("org/t5", remote=True)
    near = headrank.spectra(str(dirs[10][0]))
    pd.testing.assert_frame_equal(far.table, near.table)
    np.testing.assert_array_equal(far.sv["qk"], near.sv["qk"])


def test_decoder_of_an_encoder_decoder_alone(tmp_path):
    """A BART causal-LM checkpoint holds the decoder only: its self- and cross-attention are read."""
    import headrank

    cfg = tf.BartConfig(d_model=32, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
                        decoder_attention_heads=2, encoder_ffn_dim=40, decoder_ffn_dim=40, vocab_size=101,
                        max_position_embeddings=64)
    tf.BartForCausalLM(cfg).save_pretrained(tmp_path / "bart")
    res = headrank.spectra(str(tmp_path / "bart"))
    assert res.meta["attention"] == ["decoder"] * 3 + ["cross"] * 3
    assert set(res.table["head"]) == {0, 1}  # decoder_attention_heads, not the encoder's 4


def test_decoder_only_tables_have_no_attention_column(tmp_path):
    import headrank

    tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=101, n_positions=16)).save_pretrained(
        tmp_path / "gpt2")
    res = headrank.spectra(str(tmp_path / "gpt2"))
    assert "attention" not in res.table.columns and "attention" not in res.summary().columns
    assert "attention" not in res.meta and layout_for({"model_type": "gpt2"}).parts == ()
