"""The reader contract (headrank.io.tensor_source): every reader of the io layer is a ``TensorSource``
(``keys``, ``get``, ``meta``) built on ``BaseCheckpoint``, checked on a small real file of each
kind (sharded bf16 safetensors, a PyTorch ``.bin``, a live module and a state_dict, a GGUF file
with a Q8_0 tensor, a PEFT LoRA adapter, a factored compress output, the same safetensors and GGUF
files over HTTP ranges)
against what the files say independently (safetensors' and gguf's own readers, the module's
parameters); a source's path is resolved once; and no io class writes another class's private
attributes (read from the source's AST)."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest
import torch
import transformers as tf
from safetensors import safe_open

import headrank.io as io_pkg
from headrank.errors import HeadRankError
from headrank.io import checkpoint as ck
from headrank.io import remote
from headrank.io.tensor_source import BaseCheckpoint, TensorMeta, TensorSource

gguf = pytest.importorskip("gguf")

SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96, vocab_size=101,
             num_key_value_heads=2)
Q = "model.layers.1.self_attn.q_proj.weight"
V = "model.layers.1.self_attn.v_proj.weight"


def _write_gguf(sd: dict[str, torch.Tensor], path: Path) -> Path:
    """Layer 1 of a llama as llama.cpp lays it out: Q quantized to Q8_0, the rest float32."""
    from headrank.io.gguf import permute_rotary

    w = gguf.GGUFWriter(str(path), "llama")
    for add, v in ((w.add_block_count, 2), (w.add_embedding_length, 64), (w.add_head_count, 4),
                   (w.add_head_count_kv, 2), (w.add_key_length, 16), (w.add_value_length, 16)):
        add(v)
    for i in range(2):
        p = f"model.layers.{i}.self_attn."
        q = permute_rotary(sd[p + "q_proj.weight"], 4).numpy()
        w.add_tensor(f"blk.{i}.attn_q.weight", gguf.quants.quantize(q, gguf.GGMLQuantizationType.Q8_0),
                     raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        w.add_tensor(f"blk.{i}.attn_k.weight", permute_rotary(sd[p + "k_proj.weight"], 2).numpy())
        for name, t in (("attn_v", "v_proj"), ("attn_output", "o_proj")):
            w.add_tensor(f"blk.{i}.{name}.weight", sd[p + t + ".weight"].numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("readers")
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(tf.LlamaConfig(**SMALL)).eval()
    model.to(torch.bfloat16).save_pretrained(root / "sharded", safe_serialization=True, max_shard_size="60KB")
    model.float()
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.config.save_pretrained(root / "bin")  # transformers now always writes safetensors: the .bin by hand
    torch.save(sd, root / "bin" / "pytorch_model.bin")
    return {"root": root, "model": model, "sd": sd, "gguf": _write_gguf(sd, root / "m.gguf")}


@pytest.fixture(scope="module")
def server(files):
    import huggingface_hub.constants as hc

    from tests.io.hubserver import HubServer

    with pytest.MonkeyPatch.context() as mp:
        for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN"):
            mp.delenv(k, raising=False)
        mp.setattr(hc, "HF_HUB_OFFLINE", False)
        with HubServer(root=files["root"]) as s:
            s.add("org/llama", "main", files["root"] / "sharded")
            mp.setenv("HF_ENDPOINT", s.url)
            yield s


def _shard_of(d: Path, name: str) -> str:
    return json.loads((d / "model.safetensors.index.json").read_text())["weight_map"][name]


def _safetensors_expect(d: Path, name: str) -> tuple[torch.Tensor, TensorMeta]:
    """The tensor and its meta as safetensors' own reader gives them."""
    shard = _shard_of(d, name)
    with safe_open(str(d / shard), "pt") as h:
        t = h.get_tensor(name)
    return t, TensorMeta("bfloat16", tuple(t.shape), t.numel() * 2, shard)


def _gguf_expect(path: Path, files) -> dict[str, tuple[torch.Tensor | None, TensorMeta]]:
    r = gguf.GGUFReader(path)
    by = {t.name: t for t in r.tensors}
    q = by["blk.1.attn_q.weight"]
    assert q.tensor_type.name == "Q8_0" and int(q.n_bytes) == 64 * 64 // 32 * 34  # 32 values in 34 bytes
    return {"blk.1.attn_q.weight": (None, TensorMeta("Q8_0", (64, 64), 64 * 64 // 32 * 34, path.name)),
            "blk.1.attn_v.weight": (files["sd"][V], TensorMeta("F32", (32, 64), 32 * 64 * 4, path.name))}


def _readers(files, server):
    """(reader, {name: (expected tensor or None, expected meta)}) for every kind."""
    from headrank.io.gguf import GGUFCheckpoint
    from headrank.io.live import LiveCheckpoint

    sh, sd = files["root"] / "sharded", files["sd"]
    st = {n: _safetensors_expect(sh, n) for n in (Q, V)}
    f32 = {n: (sd[n], TensorMeta("float32", tuple(sd[n].shape), sd[n].numel() * 4, None)) for n in (Q, V)}
    binf = {n: (t, TensorMeta(m.dtype, m.shape, m.nbytes, "pytorch_model.bin")) for n, (t, m) in f32.items()}
    out = [(ck.Checkpoint(sh), st), (ck.Checkpoint(files["root"] / "bin"), binf),
           (LiveCheckpoint(files["model"]), f32), (LiveCheckpoint(sd, {"model_type": "llama"}), f32),
           (GGUFCheckpoint(files["gguf"]), _gguf_expect(files["gguf"], files)),
           (remote.open_remote("org/llama")[0], st),
           (remote.open_remote(f"{server.url}/files/m.gguf")[0], _gguf_expect(files["gguf"], files))]
    adapted = _adapted(files)
    if adapted is not None:
        out.append(adapted)
    return out + [_factored(files)]


def _factored(files):
    """A factored compress output of the sharded checkpoint (OV cut to rank 2), against the same
    cut written dense: v_proj at its uncut shape, its bytes as stored; q_proj as it was."""
    from headrank.compress import compress
    from headrank.io.checkpoint import locate
    from headrank.io.factored import FactoredCheckpoint

    sh, fac, den = files["root"] / "sharded", files["root"] / "factored", files["root"] / "dense"
    if not fac.exists():
        compress(str(sh), fac, rank=2, products="ov", whiten=False)
        compress(str(sh), den, rank=2, products="ov", whiten=False, format="dense")
    stored = {}
    for f in fac.glob("*.safetensors"):
        with safe_open(str(f), "pt") as h:
            stored.update({k: (h.get_slice(k).get_shape(), f.name) for k in h.keys() if k in (Q, V)})
    expect = {}
    for n in (Q, V):
        want, _ = _safetensors_expect(den, n) if (den / "model.safetensors.index.json").exists() else \
            (safe_open(str(den / "model.safetensors"), "pt").get_tensor(n), None)
        shape, file = stored[n]
        expect[n] = (want, TensorMeta("bfloat16", tuple(want.shape), math.prod(shape) * 2, file))
    assert stored[V][0][0] < 32  # the cut shrank v_proj: the reader restores its 32 rows
    return FactoredCheckpoint(locate(fac)), expect


def _adapted(files):
    """A PEFT adapter on q_proj over the float32 checkpoint; v_proj is left as the base's."""
    try:
        import peft
    except ImportError:  # the dev extra has it; without it the adapter reader goes unchecked here
        return None
    from headrank.io.adapters import AdaptedCheckpoint

    torch.manual_seed(1)
    base = tf.LlamaForCausalLM(files["model"].config)
    base.load_state_dict(files["sd"])
    pm = peft.get_peft_model(base, peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"],
                                                   init_lora_weights=False))
    pm.save_pretrained(files["root"] / "adapter")
    merged = {k: v.detach() for k, v in pm.merge_and_unload().state_dict().items()}
    reader = AdaptedCheckpoint(files["root"] / "adapter", ck.Checkpoint(files["root"] / "bin"))
    sd = files["sd"]
    return reader, {Q: (merged[Q], TensorMeta("float64 (adapted)", (64, 64), None, "pytorch_model.bin")),
                    V: (sd[V], TensorMeta("float32", (32, 64), 32 * 64 * 4, "pytorch_model.bin"))}


def _concrete_readers() -> set[str]:
    from headrank.io import adapters, live  # noqa: F401 - every reader's module, imported

    remote._gguf_class()
    todo, seen = [BaseCheckpoint], set()
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("headrank."):
                seen.add(sub.__name__)
    return seen


def test_every_reader_keeps_the_tensor_source_contract(files, server):
    readers = _readers(files, server)
    kinds = {type(r).__name__ for r, _ in readers}
    assert kinds == _concrete_readers() - ({"AdaptedCheckpoint"} - kinds)  # a new reader must be added here
    for reader, expect in readers:
        kind = type(reader).__name__
        assert isinstance(reader, TensorSource) and isinstance(reader, BaseCheckpoint), kind
        keys = reader.keys()
        assert len(keys) == len(set(keys)) and all(name in keys and name in reader for name in expect), kind
        for name, (want, meta) in expect.items():
            got = reader.get(name)
            assert reader.meta(name) == meta and reader.dtype(name) == meta.dtype, (kind, name, reader.meta(name))
            assert tuple(got.shape) == meta.shape, (kind, name)
            if want is not None:
                tol = 1e-6 if "adapted" in meta.dtype else 0.0  # peft's own merge is float32, ours float64
                torch.testing.assert_close(got.to(torch.float64), want.to(torch.float64), rtol=tol, atol=tol,
                                           msg=f"{kind} {name}")
        assert "no.such.tensor" not in reader
        for op in (reader.get, reader.meta):
            with pytest.raises(HeadRankError, match="tensor 'no.such.tensor' not found in"):
                op("no.such.tensor")
        with reader:
            pass


def test_gguf_q8_0_dequantizes_to_the_written_weights(files):
    """The Q8_0 tensor's meta says what is stored; ``get`` gives the llama.cpp-permuted rows
    back in Hugging Face order, within Q8_0's rounding of each 32-value block."""
    from headrank.io.gguf import GGUFCheckpoint

    with GGUFCheckpoint(files["gguf"]) as g:
        got, want = g.get("blk.1.attn_q.weight"), files["sd"][Q]
    scale = want.reshape(64, 2, 32).abs().amax(-1, keepdim=True) / 127  # Q8_0: one scale per block
    assert ((got - want).reshape(64, 2, 32).abs() <= (0.5 + 127 * 2.0 ** -11) * scale).all()  # the scale is float16


def test_the_source_is_resolved_once(files, monkeypatch, tmp_path):
    """A Trainer output_dir: its highest checkpoint-N is found once, and the reader is built
    from what was found (nothing patched afterwards: config and source are the constructor's)."""
    from headrank.io.sources import open_reader

    for step in (5, 10):
        files["model"].save_pretrained(tmp_path / f"checkpoint-{step}", safe_serialization=True)
    calls = {"local_path": [], "resolve_dir": []}
    for fn in calls:
        real = getattr(ck, fn)
        monkeypatch.setattr(ck, fn, lambda *a, _real=real, _fn=fn, **k: calls[_fn].append(a[0]) or _real(*a, **k))
    reader = open_reader(tmp_path, config={**files["model"].config.to_dict(), "marker": 1})
    assert calls == {"local_path": [tmp_path], "resolve_dir": [tmp_path]}
    assert reader.ckpt.path == tmp_path / "checkpoint-10" and reader.ckpt.config["marker"] == 1
    assert reader.ckpt.source == str(tmp_path) and reader.ckpt.config_path == "<config dict>"
    assert reader.origin["input"] == "trainer" and reader.origin["resolved_from"] == str(tmp_path.resolve())


# -- no class writes another's private attributes -------------------------------------------------------
def _io_classes() -> dict[str, tuple[list[str], set[str], ast.ClassDef, str]]:
    """Every class of src/headrank/io: (base names, private ``self._x`` it assigns, node, file)."""
    out = {}
    for f in sorted(Path(io_pkg.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ClassDef):
                own = {t.attr for t in _assigned(node) if _is_self(t) and t.attr.startswith("_")}
                out[node.name] = ([ast.unparse(b) for b in node.bases], own, node, f.name)
    return out


def _assigned(tree: ast.AST) -> list[ast.Attribute]:
    """Attribute targets of every assignment in ``tree`` (tuples unpacked)."""
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        while targets:
            t = targets.pop()
            if isinstance(t, (ast.Tuple, ast.List)):
                targets.extend(t.elts)
            elif isinstance(t, ast.Attribute):
                found.append(t)
    return found


def _is_self(t: ast.Attribute) -> bool:
    return isinstance(t.value, ast.Name) and t.value.id == "self"


def test_no_io_module_writes_private_attributes_of_another_object():
    bad = []
    for f in sorted(Path(io_pkg.__file__).parent.glob("*.py")):
        for t in _assigned(ast.parse(f.read_text())):
            if t.attr.startswith("_") and not t.attr.startswith("__") and not _is_self(t):
                bad.append(f"{f.name}:{t.lineno}: {ast.unparse(t)}")
    assert not bad, bad


def test_no_reader_sets_the_private_fields_of_a_class_it_derives_from():
    classes = _io_classes()

    def ancestors(name: str) -> list[str]:
        bases = [b.split(".")[-1] for b in classes[name][0] if b.split(".")[-1] in classes]
        return bases + [a for b in bases for a in ancestors(b)]

    readers = [n for n in classes if "BaseCheckpoint" in ancestors(n)]
    assert {"Checkpoint", "LiveCheckpoint", "GGUFCheckpoint", "AdaptedCheckpoint", "RemoteCheckpoint",
            "RemoteGGUFCheckpoint"} <= set(readers)
    for name in classes:
        for base in ancestors(name):
            clash = classes[name][1] & classes[base][1]
            assert not clash, f"{name} ({classes[name][3]}) sets {sorted(clash)}, private fields of {base}"
    for name in readers:  # a reader that defines __init__ calls its base's
        init = next((n for n in classes[name][2].body if isinstance(n, ast.FunctionDef) and n.name == "__init__"),
                    None)
        calls = [] if init is None else [ast.unparse(c.func) for c in ast.walk(init) if isinstance(c, ast.Call)]
        assert init is None or "super().__init__" in calls, f"{name}.__init__ does not call super().__init__"


def test_meta_nbytes_agree_with_the_stored_dtype(files):
    """bf16 safetensors: two bytes per value, and the shard files' sizes add up."""
    d = files["root"] / "sharded"
    with ck.Checkpoint(d) as c:
        metas = [c.meta(n) for n in c.keys()]
        total = sum(m.nbytes for m in metas)
        assert all(m.nbytes == math.prod(m.shape) * 2 and m.dtype == "bfloat16" for m in metas)
        headers = sum(8 + int.from_bytes(p.read_bytes()[:8], "little") for p in c.files)
        assert total + headers == sum(p.stat().st_size for p in c.files)
