"""A hostile or damaged factored output is one HeadRankError line from `load_compressed`, checked
before any model is built (issue 46, "Tracebacks" and "Loads from outside the checkpoint"): each
case below is a copy of one real factored output with one file planted or changed, loaded under
a 30 s alarm (no hang) and compared with what the code gave before (a traceback, a load from
outside, or a 2.6 GB build)."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
import transformers as tf

from headrank.compress import compress, load_compressed
from headrank.errors import HeadRankError
from tests.fuzz.harness import time_limit

LLAMA = dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2, intermediate_size=64,
             vocab_size=97, head_dim=8, tie_word_embeddings=True)
V0 = "model.layers.0.self_attn.v_proj"


@pytest.fixture(scope="module")
def factored(tmp_path_factory):
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("fac")
    tf.LlamaForCausalLM(tf.LlamaConfig(**LLAMA)).save_pretrained(root / "src")
    os.environ.setdefault("HEADRANK_CACHE", str(root / "cache"))
    compress(str(root / "src"), root / "f", rank=4)
    return root / "f"


@pytest.fixture
def alarm():
    with time_limit(30):
        yield


def _copy(factored, tmp_path):
    d = tmp_path / "out"
    shutil.copytree(factored, d)
    return d


def _edit_json(d, name, fn):
    p = d / name
    data = json.loads(p.read_text())
    new = fn(data)
    p.write_text(new if isinstance(new, str) else json.dumps(data if new is None else new))


def _spec(fn):
    return lambda m: fn(m["modules"][V0]) or m


def _refused(d, match, **kw):
    with pytest.raises(HeadRankError, match=match) as e:
        load_compressed(d, **kw)
    assert "\n" not in str(e.value) and len(str(e.value)) < 600
    return str(e.value)


def test_the_untouched_output_loads(factored, alarm):
    assert load_compressed(factored) is not None


MANIFEST_CASES = {
    "negative run": (_spec(lambda s: s.update(index=[[-4, 4]])), "must lie in"),
    "reversed run": (_spec(lambda s: s.update(index=[[4, 0]])), "reversed"),
    "out of bounds": (_spec(lambda s: s.update(index=[[0, 999]])), "leaves"),
    "overlapping runs": (_spec(lambda s: s.update(index=[[0, 4], [2, 6]])), "overlaps"),
    "NaN": (lambda m: json.dumps(m).replace("[0, 4]", "[NaN, 4]", 1), "must be an integer"),
    "strings": (_spec(lambda s: s.update(index=[["0", "4"]])), "must be an integer"),
    "triple": (_spec(lambda s: s.update(index=[[0, 4, 8]])), "pair"),
    "2M runs": (_spec(lambda s: s.update(index=[[i, i + 1] for i in range(0, 4_000_000, 2)])), "list of 1 to"),
    "unknown key": (_spec(lambda s: s.update(evil=1)), "differs in"),
    "spec not a dict": (lambda m: m["modules"].update({V0: [1, 2]}), "must be an object"),
    "lm_head": (lambda m: m["modules"].update({"lm_head": {"keep": "rows", "features": 97, "index": [[0, 4]]}}),
                "not an attention projection"),
    "no modules": (lambda m: m.update(modules={}), "names no module"),
    "features 1e12": (_spec(lambda s: s.update(features=10**12)), "features must lie in"),
    "wrong features": (_spec(lambda s: s.update(features=17)), "features for a projection of 16"),
    "dotted escape": (lambda m: m["modules"].update({"../../x": m["modules"].pop(V0)}), "not a module name"),
    "deep nesting": (lambda m: '{"format": "headrank-factored", "modules": ' + "[" * 100_000 + "]" * 100_000 + "}",
                     "nested too deeply|not a headrank factored manifest"),
    "not JSON": (lambda m: "{not json", "cannot parse"),
}


@pytest.mark.parametrize("case", list(MANIFEST_CASES))
def test_a_hostile_manifest_is_one_line(factored, tmp_path, alarm, case):
    d = _copy(factored, tmp_path)
    fn, match = MANIFEST_CASES[case]
    _edit_json(d, "factored.json", fn)
    _refused(d, match)


CONFIG_CASES = {
    "heads 0": ({"num_attention_heads": 0}, "num_attention_heads must lie in"),
    "hidden size a string": ({"hidden_size": "48"}, "hidden_size must be an integer"),
    "1e6 layers": ({"num_hidden_layers": 1_000_000}, "num_hidden_layers must lie in"),
    "vocabulary 2^31": ({"vocab_size": 2**31}, "vocab_size must lie in"),
    "width 2^31": ({"hidden_size": 2**31}, "hidden_size must lie in"),
    "garbage rope": ({"rope_scaling": {"rope_type": "evil", "factor": "x"}, "rope_parameters": "garbage"},
                     "load_compressed: cannot load .* with transformers"),
    "unknown auto_map type": ({"model_type": "evil-type", "auto_map": {"AutoModel": "evil.Model"}},
                              "load_compressed: cannot load .* with transformers"),
}


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_a_hostile_config_is_one_line_before_anything_is_built(factored, tmp_path, alarm, case):
    d = _copy(factored, tmp_path)
    changes, match = CONFIG_CASES[case]
    _edit_json(d, "config.json", lambda c: c.update(changes))
    _refused(d, match)


def _index(d, weight_map):
    (d / "factored-model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def test_a_weight_map_entry_outside_the_output_is_refused(factored, tmp_path, alarm):
    d = _copy(factored, tmp_path)
    shutil.copy(d / "factored-model.safetensors", tmp_path / "outside.safetensors")
    for entry in ("../outside.safetensors", str(tmp_path / "outside.safetensors")):
        _index(d, {"model.embed_tokens.weight": entry})
        _refused(d, "lies outside the checkpoint directory")


@pytest.mark.parametrize(("text", "match"), [("[1, 2]", "weight_map must be a non-empty object"),
                                             ("{bad json", "cannot parse")])
def test_a_hostile_index_is_one_line(factored, tmp_path, alarm, text, match):
    d = _copy(factored, tmp_path)
    (d / "factored-model.safetensors.index.json").write_text(text)
    _refused(d, match)


@pytest.mark.parametrize(("changes", "match"), [({"n_kv_heads": 0}, "n_kv_heads must lie in"),
                                                ({"head_dim": -8}, "head_dim must lie in"),
                                                ({"n_heads": 10**9}, "n_heads must lie in"),
                                                ({"head_dim": 10**11}, "head_dim must lie in")])
def test_a_hostile_compress_json_is_one_line(factored, tmp_path, alarm, changes, match):
    d = _copy(factored, tmp_path)
    _edit_json(d, "compress.json", lambda r: r["config"].update(changes))
    _refused(d, match, latent_kv=True)


@pytest.mark.parametrize("name", ["factored.json", "compress.json", "config.json",
                                  "factored-model.safetensors.index.json"])
def test_a_fifo_in_place_of_a_record_does_not_hang(factored, tmp_path, alarm, name):
    d = _copy(factored, tmp_path)
    (d / name).unlink(missing_ok=True)
    os.mkfifo(d / name)
    _refused(d, "not a regular file")


def test_a_500_mb_manifest_is_refused_before_it_is_read(factored, tmp_path, alarm):
    d = _copy(factored, tmp_path)
    with open(d / "factored.json", "r+b") as fh:  # sparse: no disk used
        fh.truncate(500 << 20)
    _refused(d, "more than a factored manifest may be")


def _weights(d, fn):
    p = d / "factored-model.safetensors"
    p.write_bytes(fn(p.read_bytes()))


@pytest.mark.parametrize(("fn", "match"), [
    (lambda b: b[: len(b) // 2], "outside the file|corrupt safetensors header"),
    (lambda b: b"\x00garbage" * 64, "corrupt safetensors header|cannot parse"),
    (lambda b: (10**12).to_bytes(8, "little") + b[8:], "corrupt safetensors header"),
])
def test_damaged_weights_are_one_line(factored, tmp_path, alarm, fn, match):
    d = _copy(factored, tmp_path)
    _weights(d, fn)
    _refused(d, match)


def test_a_shape_mismatch_is_one_line(factored, tmp_path, alarm):
    from safetensors.torch import load_file, save_file

    d = _copy(factored, tmp_path)
    sd = load_file(d / "factored-model.safetensors")
    sd["model.layers.1.mlp.up_proj.weight"] = torch.zeros(3, 5)
    save_file(sd, d / "factored-model.safetensors")
    _refused(d, "has shape \\[3, 5\\]")


@pytest.mark.parametrize(("kw", "match"), [
    ({"path": None}, "`path` must be"), ({"path": 7}, "`path` must be"),
    ({"dtype": 7}, "`dtype` must be"), ({"dtype": torch.int8}, "`dtype` must be a floating torch dtype"),
    ({"attn_implementation": "evil"}, "`attn_implementation` must be one of"),
    ({"latent_kv": "yes"}, "`latent_kv` must be True or False"),
])
def test_bad_arguments_are_one_line(factored, alarm, kw, match):
    kw = {"path": factored, **kw}
    with pytest.raises(HeadRankError, match=match):
        load_compressed(kw.pop("path"), **kw)
