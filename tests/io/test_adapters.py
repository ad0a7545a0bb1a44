"""LoRA adapters saved by ``peft`` and analysed on their base: the adapted spectra equal those of
peft's own ``merge_and_unload`` checkpoint; ``delta`` equals a dense float64 reference of the
products' change; a base that does not fit the adapter is one clear error."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers as tf
from typer.testing import CliRunner

peft = pytest.importorskip("peft")

from headrank.analysis.scan import analyze  # noqa: E402
from headrank.cli import app  # noqa: E402
from headrank.errors import HeadRankError  # noqa: E402

SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96, vocab_size=101,
             num_key_value_heads=2)


def make_adapter(tmp_path, arch="llama", targets=("q_proj", "v_proj"), rslora=False, seed=0):
    torch.manual_seed(seed)
    if arch == "llama":
        base = tf.LlamaForCausalLM(tf.LlamaConfig(**SMALL))
    else:
        base = tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=101, n_positions=32))
    base.save_pretrained(tmp_path / "base")
    base = type(base).from_pretrained(tmp_path / "base")
    cfg = peft.LoraConfig(r=4, lora_alpha=12, target_modules=list(targets), init_lora_weights=False,
                          use_rslora=rslora, fan_in_fan_out=arch == "gpt2")
    pm = peft.get_peft_model(base, cfg)
    pm.save_pretrained(tmp_path / "adapter")
    merged = pm.merge_and_unload()
    merged.save_pretrained(tmp_path / "merged")
    return tmp_path / "adapter"


def rel(a, b):
    return max(float(np.abs(a.sv[p] - b.sv[p]).max() / np.abs(b.sv[p]).max()) for p in ("qk", "ov"))


@pytest.mark.parametrize("arch,targets,rslora", [
    ("llama", ("q_proj", "v_proj"), False),
    ("llama", ("q_proj", "k_proj", "v_proj", "o_proj"), True),
    ("gpt2", ("c_attn", "c_proj"), False),  # Conv1D: fan_in_fan_out
])
def test_adapted_spectra_equal_peft_merge(tmp_path, arch, targets, rslora):
    adapter = make_adapter(tmp_path, arch, targets, rslora)
    got, merged, base = analyze(adapter), analyze(tmp_path / "merged"), analyze(tmp_path / "base")
    assert rel(got, merged) < 1e-5  # peft merges in float32; headrank adds the update in float64
    assert rel(got, base) > 1e-3  # the adapter did change something
    a = got.meta["adapter"]
    assert got.meta["input"] == "adapter" and a["r"] == [4] and a["scaling"] == [12 / (2.0 if rslora else 4)]
    assert a["base"] == str(tmp_path / "base")


def test_delta_equals_dense_reference(tmp_path):
    adapter = make_adapter(tmp_path, targets=("q_proj", "k_proj", "v_proj", "o_proj"))
    got = analyze(adapter, delta=True)
    sd_new = tf.LlamaForCausalLM.from_pretrained(tmp_path / "merged").state_dict()
    sd_old = tf.LlamaForCausalLM.from_pretrained(tmp_path / "base").state_dict()
    H, Hkv, dh = 4, 2, 16
    err = 0.0
    for i in range(2):
        def w(sd, n, i=i):
            return sd[f"model.layers.{i}.self_attn.{n}.weight"].double()

        for h in range(H):
            kv = h // (H // Hkv)
            rows, kv_rows = slice(h * dh, (h + 1) * dh), slice(kv * dh, (kv + 1) * dh)
            qk = (w(sd_new, "k_proj")[kv_rows].T @ w(sd_new, "q_proj")[rows]
                  - w(sd_old, "k_proj")[kv_rows].T @ w(sd_old, "q_proj")[rows])
            ov = (w(sd_new, "o_proj")[:, rows] @ w(sd_new, "v_proj")[kv_rows]
                  - w(sd_old, "o_proj")[:, rows] @ w(sd_old, "v_proj")[kv_rows])
            for p, m in (("qk", qk), ("ov", ov)):
                ref = torch.linalg.svdvals(m)[: 2 * dh].numpy()
                err = max(err, float(np.abs(got.sv[p][i, h] - ref).max() / ref.max()))
    assert err < 1e-5  # the merged file is float32 (peft's merge); the rest is float64
    assert "adapter delta" in got.meta["conventions"]["weights"]


def test_base_option_and_mismatch(tmp_path):
    adapter = make_adapter(tmp_path)
    same = analyze(adapter, base=tmp_path / "base")
    np.testing.assert_array_equal(same.sv["qk"], analyze(adapter).sv["qk"])
    torch.manual_seed(0)
    small = dict(SMALL, hidden_size=32)
    tf.LlamaForCausalLM(tf.LlamaConfig(**small)).save_pretrained(tmp_path / "other")
    with pytest.raises(HeadRankError, match="does not match the base"):
        analyze(adapter, base=tmp_path / "other")
    res = CliRunner().invoke(app, ["spectra", str(adapter), "--base", str(tmp_path / "other"),
                                   "--out", str(tmp_path / "out")])
    assert res.exit_code == 2 and "does not match the base" in res.output
    assert len(res.output.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_base_and_delta_need_an_adapter(tmp_path):
    make_adapter(tmp_path)
    with pytest.raises(HeadRankError, match="apply to a LoRA adapter"):
        analyze(tmp_path / "base", delta=True)


def test_dora_refused(tmp_path):
    adapter = make_adapter(tmp_path)
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**cfg, "use_dora": True}))
    with pytest.raises(HeadRankError, match="DoRA"):
        analyze(adapter)
