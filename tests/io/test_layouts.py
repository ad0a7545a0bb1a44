"""Per-head factors extracted from MiniLM reproduce the real transformers BERT attention.

The reference is the Hugging Face module's own forward pass (float64, eager attention) on
real token inputs: each head's attention probabilities, and each head's value-output
contribution to ``attention.output.dense`` before its bias.
"""

import pytest
import torch

from headrank.errors import HeadRankError
from headrank.io.checkpoint import Checkpoint
from headrank.io.layouts import AttentionReader, layout_for, layout_model_types


@pytest.fixture(scope="module")
def hf_run(minilm_dir, sentences):
    from tokenizers import Tokenizer
    from transformers import BertModel

    model = BertModel.from_pretrained(minilm_dir, attn_implementation="eager").double().eval()
    tok = Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    captured = []  # per forward: {layer: {...}}
    hooks = []
    for i, layer in enumerate(model.encoder.layer):
        def self_hook(mod, args, kwargs, out, i=i):
            captured[-1].setdefault(i, {}).update(x=args[0] if args else kwargs["hidden_states"], probs=out[1])

        def dense_hook(mod, args, out, i=i):
            captured[-1].setdefault(i, {}).update(context=args[0], dense_out=out)

        hooks.append(layer.attention.self.register_forward_hook(self_hook, with_kwargs=True))
        hooks.append(layer.attention.output.dense.register_forward_hook(dense_hook))
    runs = []
    with torch.no_grad():
        for text in sentences:
            ids = torch.tensor([tok.encode(text).ids])
            captured.append({})
            model(input_ids=ids)
            runs.append(captured[-1])
    for h in hooks:
        h.remove()
    return model, runs


@pytest.mark.slow
def test_minilm_qk_factors_reproduce_hf_attention_probabilities(hf_run, minilm_dir):
    model, runs = hf_run
    with Checkpoint(minilm_dir) as ckpt:
        reader = AttentionReader(ckpt)
        dh = reader.dims.head_dim
        for i in range(reader.dims.n_layers):
            hw = reader.read_layer(i)
            A, B = (f.double() for f in hw.qk_factors())  # A Bᵀ = W_Kᵀ W_Q, (H, d, dh)
            names = reader.tensor_names(i)
            bq = ckpt.get(names["q"].replace("weight", "bias")).double().reshape(-1, dh)
            for cap in runs:
                x = cap[i]["x"][0]  # (n, d)
                M = A @ B.mT  # (H, d, d), formed only here, as the reference path
                # q_i·k_j = x_iᵀ Mᵀ x_j + b_qᵀ W_K x_j + (terms constant in j, cancelled by softmax)
                scores = x @ M.mT @ x.T + (bq[:, None, :] @ A.mT @ x.T)
                probs = torch.softmax(scores / dh**0.5, dim=-1)
                torch.testing.assert_close(probs, cap[i]["probs"][0], rtol=0, atol=1e-10)


@pytest.mark.slow
def test_minilm_ov_factors_reproduce_hf_per_head_value_output(hf_run, minilm_dir):
    model, runs = hf_run
    with Checkpoint(minilm_dir) as ckpt:
        reader = AttentionReader(ckpt)
        H, dh = reader.dims.n_heads, reader.dims.head_dim
        for i in range(reader.dims.n_layers):
            hw = reader.read_layer(i)
            A, B = (f.double() for f in hw.ov_factors())  # A Bᵀ = P_h W_V,h
            names = reader.tensor_names(i)
            bv = ckpt.get(names["v"].replace("weight", "bias")).double().reshape(H, dh)
            dense = model.encoder.layer[i].attention.output.dense
            for cap in runs:
                x, probs, ctx = cap[i]["x"][0], cap[i]["probs"][0], cap[i]["context"][0]
                total = torch.zeros_like(cap[i]["dense_out"][0])
                for h in range(H):
                    # HF's own head h: its slice of the context through the real output layer
                    masked = torch.zeros_like(ctx)
                    masked[:, h * dh:(h + 1) * dh] = ctx[:, h * dh:(h + 1) * dh]
                    hf_head = dense(masked) - dense.bias
                    ours = probs[h] @ (x @ (A[h] @ B[h].T).T + A[h] @ bv[h])
                    torch.testing.assert_close(ours, hf_head, rtol=0, atol=1e-10)
                    total += ours
                torch.testing.assert_close(total + dense.bias, cap[i]["dense_out"][0], rtol=0, atol=1e-10)


def test_unknown_model_type_lists_supported():
    with pytest.raises(HeadRankError, match="unsupported model_type 'no_such_type'.*bert"):
        layout_for({"model_type": "no_such_type"})
    assert "bert" in layout_model_types()


def test_refused_model_type_says_why():
    """A type whose check was refused (generated table) gives the recorded reason, one line."""
    with pytest.raises(HeadRankError, match="model type 'mamba' is refused: no softmax attention") as e:
        layout_for({"model_type": "mamba"})
    assert "\n" not in str(e.value)


def test_prefixed_checkpoint_is_found(tmp_path, minilm_dir):
    """A BertForMaskedLM-style file stores the encoder under 'bert.'."""
    import shutil

    from safetensors.torch import load_file, save_file

    sd = load_file(minilm_dir / "model.safetensors")
    save_file({"bert." + k: v for k, v in sd.items()} | {"cls.predictions.bias": torch.zeros(3)},
              tmp_path / "model.safetensors")
    shutil.copy(minilm_dir / "config.json", tmp_path / "config.json")
    with Checkpoint(tmp_path) as ckpt:
        r = AttentionReader(ckpt)
        assert r.prefix == "bert."
        torch.testing.assert_close(r.read_layer(2).wq, AttentionReader(Checkpoint(minilm_dir)).read_layer(2).wq)


# -- the TOML escape hatch: renamed split names, error texts ----------------------------------------
_FUSED_TOML = ('split = "{split}"\n[tensors]\nqkv = "h.{{i}}.qkv.weight"\no = "h.{{i}}.o.weight"\n'
               '[sizes]\nn_layers = 2\nd_model = 64\nn_heads = 4\nn_kv_heads = 2\n')


@pytest.mark.parametrize("old,new", [("grouped", "fused_per_kv_group"), ("interleaved", "fused_per_head")])
def test_old_split_names_are_aliases_with_a_warning(tmp_path, old, new):
    from headrank.io.layout_toml import layout_from_toml

    p = tmp_path / "l.toml"
    p.write_text(_FUSED_TOML.format(split=old))
    with pytest.warns(FutureWarning, match=f"now called '{new}'"):
        lay = layout_from_toml(p)
    assert lay.split == new
    p.write_text(_FUSED_TOML.format(split=new))
    assert layout_from_toml(p).split == new


def test_toml_error_texts_name_the_table(tmp_path):
    from headrank.io.layout_toml import layout_from_toml

    p = tmp_path / "layout.toml"
    p.write_text('split = "fused"\n[tensors]\nq = "a.{i}"\nk = "b.{i}"\n[sizes]\nn_layers = 1\n')
    with pytest.raises(HeadRankError) as e:
        layout_from_toml(p)
    assert "the [tensors] table must name exactly qkv, o for split 'fused'" in str(e.value)
    assert "(got k, q)" in str(e.value)
    p.write_text(_FUSED_TOML.format(split="fused").replace("d_model = 64\n", ""))
    with pytest.raises(HeadRankError, match=r"the \[sizes\] table needs integers"):
        layout_from_toml(p)


def test_fold_norm_from_a_toml_norm_table(tmp_path):
    from headrank.io.layout_toml import layout_from_toml

    p = tmp_path / "l.toml"
    p.write_text(_FUSED_TOML.format(split="fused") + '[norm]\nname = "h.{i}.ln.weight"\nkind = "rmsnorm"\n')
    lay = layout_from_toml(p)
    assert lay.norm({}).name == "h.{i}.ln.weight" and lay.norm({}).kind == "rmsnorm"
    p.write_text(_FUSED_TOML.format(split="fused") + '[norm]\nname = "h.ln.weight"\n')
    with pytest.raises(HeadRankError, match=r"the \[norm\] table needs name"):
        layout_from_toml(p)
