"""QK cuts on rotary models: whole bands dropped by energy and the non-rotary part cut are exact
at every relative position. Checked with the real Hugging Face forward: the written checkpoint
equals the original with the same bands zeroed by hand (band energies from numpy)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers as tf
from safetensors.torch import load_file

from headrank.compress import compress

LLAMA = dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2, intermediate_size=64,
             vocab_size=97, head_dim=8, attention_bias=True)
IDS = torch.tensor([[3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26], [2, 71, 82, 81, 82, 84, 59, 4, 5, 23, 9, 1]])


def _model(cls, cfg, path):
    torch.manual_seed(0)
    m = cls(cfg)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("bias") and "norm" not in n:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    m.to(torch.float64).save_pretrained(path)
    return type(m).from_pretrained(path, dtype=torch.float64).eval()


def _out(m):
    with torch.no_grad():
        return m(input_ids=IDS).logits


def test_llama_bands_dropped_by_energy_equal_zeroed_rows(tmp_path):
    ref = _model(tf.LlamaForCausalLM, tf.LlamaConfig(**LLAMA), tmp_path / "src")
    full = compress(str(tmp_path / "src"), tmp_path / "full", rank=8, products="ov,qk", format="dense")
    assert full["products"] == ["ov", "qk"] and not [n for n in full["notes"] if "without whitening" not in n]
    got = _out(tf.LlamaForCausalLM.from_pretrained(tmp_path / "full", dtype=torch.float64).eval())
    assert torch.allclose(got, _out(ref), rtol=0, atol=1e-10)

    res = compress(str(tmp_path / "src"), tmp_path / "cut", rank=4, products="qk", format="dense")
    _errors_are_the_dense_ones(res, tmp_path / "src", tmp_path / "cut")
    dh, g = 8, 3
    half = dh // 2
    with torch.no_grad():
        for layer in ref.model.layers:
            at = layer.self_attn
            q = at.q_proj.weight.numpy().reshape(6, dh, -1)
            k = at.k_proj.weight.numpy().reshape(2, dh, -1)
            for u in range(2):
                nq = (q[u * g:(u + 1) * g] ** 2).sum(-1)  # (g, dh)
                nk = (k[u] ** 2).sum(-1)
                e = np.array([0.5 * ((nq[:, j] + nq[:, j + half]) * (nk[j] + nk[j + half])).sum()
                              for j in range(half)])
                drop = np.argsort(-e)[2:]  # rank 4 keeps the two strongest bands
                rows = np.concatenate([drop, drop + half])
                for h in range(u * g, (u + 1) * g):
                    at.q_proj.weight[h * dh + rows] = 0
                    at.q_proj.bias[h * dh + rows] = 0
                at.k_proj.weight[u * dh + rows] = 0
                at.k_proj.bias[u * dh + rows] = 0
    got = _out(tf.LlamaForCausalLM.from_pretrained(tmp_path / "cut", dtype=torch.float64).eval())
    assert torch.allclose(got, _out(ref), rtol=0, atol=1e-10)


def _errors_are_the_dense_ones(res, src, cut, dh: int = 8, g: int = 3) -> None:
    """Each unit's ``frob_error`` and ``frob_rel_error``: those of the formed stacked products
    (numpy float64), original against written."""
    a, b = load_file(str(src / "model.safetensors")), load_file(str(cut / "model.safetensors"))
    for row in res["units"]:
        i, u = row["layer"], row["kv_head"]
        M = []
        for w in (a, b):
            q = w[f"model.layers.{i}.self_attn.q_proj.weight"].numpy()
            k = w[f"model.layers.{i}.self_attn.k_proj.weight"].numpy()[u * dh:(u + 1) * dh]
            M.append(np.vstack([q[h * dh:(h + 1) * dh].T @ k for h in range(u * g, (u + 1) * g)]))
        err, norm = np.linalg.norm(M[0] - M[1]), np.linalg.norm(M[0])
        assert row["frob_error"] == pytest.approx(err, rel=1e-9, abs=1e-12 * norm)
        assert row["frob_rel_error"] == pytest.approx(err / norm, rel=1e-9, abs=1e-12)
    assert any(r["frob_error"] > 0 for r in res["units"])


def test_partial_rotary_cuts_the_non_rotary_part_to_the_dense_best_rank_k(tmp_path):
    cfg = tf.GPTNeoXConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                           vocab_size=97, rotary_pct=0.5, max_position_embeddings=32)
    ref = _model(tf.GPTNeoXForCausalLM, cfg, tmp_path / "src")
    compress(str(tmp_path / "src"), tmp_path / "full", rank=8, products="qk", format="dense")
    got = _out(tf.GPTNeoXForCausalLM.from_pretrained(tmp_path / "full", dtype=torch.float64).eval())
    assert torch.allclose(got, _out(ref), rtol=0, atol=1e-10)

    res = compress(str(tmp_path / "src"), tmp_path / "cut", rank=5, products="qk", format="dense")
    a, b = load_file(str(tmp_path / "src" / "model.safetensors")), load_file(str(tmp_path / "cut" / "model.safetensors"))
    for i in range(2):
        name = f"gpt_neox.layers.{i}.attention.query_key_value.weight"
        wa, wb = (w[name].numpy().reshape(4, 3, 8, 32) for w in (a, b))  # (head, q/k/v, dh, d)
        for h in range(4):
            row = next(r for r in res["units"] if r["layer"] == i and r["kv_head"] == h)
            assert row["k"] >= 5
            for w in (wa, wb):
                pq, pk = w[h, 0, 4:], w[h, 1, 4:]  # non-rotary dims 4..7
                prod = pq.T @ pk
                if w is wa:
                    kept_bands = [j for j in range(2) if np.abs(wb[h, 1, j]).sum() > 0]
                    k_p = row["k"] - 2 * len(kept_bands)
                    U, s, Vt = np.linalg.svd(prod)
                    want = (U[:, :k_p] * s[:k_p]) @ Vt[:k_p]
                else:
                    assert np.abs(prod - want).max() <= 1e-10 * np.abs(want).max() + 1e-14
            for j in range(2):  # a band is kept unchanged or dropped whole, in q and k
                for r in (j, j + 2):
                    for t in (0, 1):
                        assert np.array_equal(wb[h, t, r], wa[h, t, r]) or not wb[h, t, r].any()
    assert res["products"] == ["qk"]


def test_qk_norm_models_refuse_qk(tmp_path):
    from headrank.errors import HeadRankError

    cfg = tf.Qwen3Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=48, vocab_size=97, head_dim=8)
    _model(tf.Qwen3ForCausalLM, cfg, tmp_path / "src")
    with pytest.raises(HeadRankError, match="normalised"):
        compress(str(tmp_path / "src"), tmp_path / "o", rank=2, products="qk")
    from typer.testing import CliRunner

    from headrank.cli import app

    r = CliRunner().invoke(app, ["compress", str(tmp_path / "src"), "--out", str(tmp_path / "o"), "--rank", "2",
                                 "--products", "ov,qk"])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "normalised" in r.output
    assert not (tmp_path / "o").exists()
    res = compress(str(tmp_path / "src"), tmp_path / "o", rank=2)
    assert res["products"] == ["ov"] and "QK not cut" in res["notes"][0]
