"""The cut/write pipeline's shortcuts, each against an independent reference: the factored
tensors made from the kept columns equal factor_layer's (the zero rows and columns dropped from
the padded tensors); the one streamed pass equals the two passes; the torch device route (run on
the CPU, as CI has no GPU) gives numpy's dense best rank-k products; any thread count gives the
same bytes; `device` and an unknown model type are one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers as tf
from safetensors.torch import load_file
from typer.testing import CliRunner

import headrank.compress.run as hc
from headrank.cli import app
from headrank.compress import compress
from headrank.compress.api import cut_layers, make_plan, parse_products
from headrank.compress.cut import UnitCut
from headrank.compress.factored import factor_layer
from headrank.compress.kept import kept_tensors
from headrank.compress.plan import Rule
from headrank.errors import HeadRankError
from headrank.io.layouts import Dims
from headrank.io.sources import open_reader

LLAMA = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2, intermediate_size=32,
             vocab_size=61, head_dim=8)


@pytest.fixture(autouse=True)
def _baseline_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADRANK_CACHE", str(tmp_path / "headrank-cache"))


def _llama(path, dtype, bias: bool = False):
    torch.manual_seed(0)
    m = tf.LlamaForCausalLM(tf.LlamaConfig(**LLAMA, attention_bias=bias))
    if bias:
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for n, p in m.named_parameters():
                if n.endswith("bias"):
                    p.copy_(0.3 * torch.randn(p.shape, generator=g))
    m.to(dtype).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def f64_dir(tmp_path_factory):
    return _llama(tmp_path_factory.mktemp("f64"), torch.float64, bias=True)


@pytest.fixture(scope="module")
def bf16_dir(tmp_path_factory):
    return _llama(tmp_path_factory.mktemp("bf16"), torch.bfloat16)


# -- the factored tensors from the kept columns --------------------------------------------
def _dense(X: torch.Tensor, S: torch.Tensor, dims: Dims, product: str) -> dict[str, torch.Tensor]:
    """The padded tensors of one product as the dense format stores them (separate split)."""
    H, dh, d = dims.n_heads, dims.head_dim, dims.d
    Xp = torch.nn.functional.pad(X, (0, dh - X.shape[-1])).reshape(H, d, dh)
    Sp = torch.nn.functional.pad(S, (0, dh - S.shape[-1]))
    if product == "ov":
        return {"v.weight": Sp.mT.reshape(-1, d), "o.weight": Xp.permute(1, 0, 2).reshape(d, H * dh)}
    return {"q.weight": Xp.mT.reshape(-1, d), "k.weight": Sp.mT.reshape(-1, d)}


@pytest.mark.parametrize("case", ["prefix", "holes", "bias_beyond", "full"])
def test_kept_tensors_equal_factor_layer_bit_for_bit(case):
    """Both products, GQA (g = 3), bfloat16: kept_tensors' tensors, biases and manifest entries
    are factor_layer's on the zero-padded tensors, including a zero column inside the kept ones
    (the gather path), a dimension kept only for its bias, and an uncut (full) layer."""
    dims = Dims(1, 12, 6, 2, 4)
    g = torch.Generator().manual_seed(3)
    w = 4 if case == "full" else 3
    cuts, tensors, biases = {}, {}, {}
    for product in ("ov", "qk"):
        X = torch.randn(2, 3 * 12, w, generator=g, dtype=torch.float64)
        S = torch.randn(2, 12, w, generator=g, dtype=torch.float64)
        if case != "full":
            X[1, :, 2] = 0  # unit 1 keeps 2 dimensions
            S[1, :, 2] = 0
        if case == "holes":
            X[0, 12:24, 1] = 0  # head 1's dimension 1 is zero in its o / q columns (not the group's others)
            S[0, :, 0] = 0
        cuts[product] = UnitCut(X, S, torch.tensor([w, w]), torch.ones(2, 4), torch.zeros(2), torch.ones(2))
        tensors.update(_dense(X.to(torch.bfloat16), S.to(torch.bfloat16), dims, product))
    for role, n in (("q", 6 * 4), ("k", 2 * 4), ("v", 2 * 4)):
        b = torch.zeros(n, dtype=torch.bfloat16)
        if case == "bias_beyond":
            b[3] = 1.5  # head 0's dimension 3, beyond the w = 3 kept columns
        if case == "full":
            b = torch.randn(n, generator=g).to(torch.bfloat16)
        biases[f"{role}.bias"] = b
    biases["o.bias"] = torch.randn(12, generator=g).to(torch.bfloat16)
    names = {r: f"{r}.weight" for r in "qkvo"}
    raw = {r: torch.empty(0, dtype=torch.bfloat16) for r in "qkvo"}
    want, want_entries = factor_layer({**tensors, **biases}, names, ("ov", "qk"))
    got, got_entries = kept_tensors(names, raw, cuts, biases, dims)
    assert json.dumps(got_entries) == json.dumps(want_entries)
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].is_contiguous()
        assert torch.equal(got[k], want[k]), k
    if case == "full":
        assert not got_entries
    else:
        assert got_entries["o"]["features"] == 6 * 4 and got["o.weight"].shape[1] < 6 * 4


# -- one pass, two passes, threads ---------------------------------------------------------
def _collect(reader, plan, factored: bool = True):
    out = {}
    for lc in cut_layers(reader, plan, factored=factored):
        out.update(lc.tensors)
        out.update({f"entry {k}": torch.tensor(v["index"]).flatten() for k, v in lc.entries.items()})
    return out


@pytest.mark.parametrize("kind, value", [("rank", 3), ("keep", 0.8)])
def test_the_streamed_pass_equals_two_passes(bf16_dir, f64_dir, kind, value):
    """A per-unit rule streams the layers once; the same plan made in two passes (spectra first)
    gives the same tensors, manifest and ranks, bit for bit."""
    for src in (bf16_dir, f64_dir):
        reader = open_reader(str(src))
        prods, _ = parse_products("ov,qk", reader)
        one = make_plan(reader, Rule(kind, value), prods, stream=True)
        two = make_plan(reader, Rule(kind, value), prods, stream=False)
        assert one.streamed and not two.streamed
        a, b = _collect(reader, one), _collect(reader, two)
        assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
        assert all(torch.equal(one.ranks[p], two.ranks[p]) for p in prods)
        assert all(torch.equal(one.spectra[p], two.spectra[p]) for p in prods)


@pytest.mark.parametrize("kw", [{"rank": 3, "products": "ov"}, {"params": 0.5}])
def test_any_thread_count_writes_the_same_bytes(bf16_dir, tmp_path, kw):
    """bfloat16 (the float32 GEMMs, shared among the workers by units): 1, 2 and 3 threads."""
    files = []
    for t in (1, 2, 3):
        res = compress(str(bf16_dir), tmp_path / str(t), threads=t, **kw)
        assert res["compute"]["threads"] == t
        files.append((tmp_path / str(t) / "factored-model.safetensors").read_bytes())
    assert files[0] == files[1] == files[2]


# -- the device route, on the CPU -----------------------------------------------------------
def _best(M: np.ndarray, k: int) -> np.ndarray:
    U, s, Vt = np.linalg.svd(M, full_matrices=False)
    return (U[:, :k] * s[:k]) @ Vt[:k]


def _ov_units(w: dict, i: int) -> list[np.ndarray]:
    """Each kv group's stacked OV product (g·d × d), dense float64, from the stored tensors."""
    n = lambda r: w[f"model.layers.{i}.self_attn.{r}_proj.weight"].double().numpy()  # noqa: E731
    v, o, dh = n("v"), n("o"), 8
    return [np.vstack([o[:, h * dh:(h + 1) * dh] @ v[u * dh:(u + 1) * dh] for h in range(u * 4, (u + 1) * 4)])
            for u in range(2)]


def test_device_route_on_the_cpu_gives_the_dense_best_rank_k(f64_dir, tmp_path, monkeypatch):
    """The torch device route (Grams, Cholesky, core SVDs and GEMMs in torch float64 on
    `device`), run with device "cpu": every unit's product is numpy's best rank-k of the
    original's, and the ranks, kept energies and errors are the CPU route's."""
    cpu = compress(str(f64_dir), tmp_path / "cpu", rank=3, products="ov", format="dense", device="cpu")
    monkeypatch.setattr(hc, "resolve_device", lambda device: "cpu")  # the device route, on the CPU
    dev = compress(str(f64_dir), tmp_path / "dev", rank=3, products="ov", format="dense", device="cuda")
    assert dev["compute"]["device"] == "cpu" and "torch float64" in dev["compute"]["linalg"]
    assert cpu["compute"]["linalg"].startswith("CPU")
    a = load_file(str(f64_dir / "model.safetensors"))
    b = load_file(str(tmp_path / "dev" / "model.safetensors"))
    for i in range(2):
        for M0, M1 in zip(_ov_units(a, i), _ov_units(b, i), strict=True):
            assert np.abs(M1 - _best(M0, 3)).max() <= 1e-10 * np.abs(M0).max()
    for r, s in zip(cpu["units"], dev["units"], strict=True):
        assert r["k"] == s["k"]
        for key in ("kept_energy", "frob_error"):
            assert s[key] == pytest.approx(r[key], rel=1e-12, abs=1e-14)


def test_device_route_on_the_cpu_bf16_factored_matches_the_cpu_route(bf16_dir, tmp_path, monkeypatch):
    """bfloat16, factored: the device route (float64 GEMMs) writes the CPU route's tensors (float32
    GEMMs) to within one bfloat16 rounding, with the same kept dimensions."""
    compress(str(bf16_dir), tmp_path / "cpu", rank=3)
    monkeypatch.setattr(hc, "resolve_device", lambda device: "cpu")
    compress(str(bf16_dir), tmp_path / "dev", rank=3)
    a = load_file(str(tmp_path / "cpu" / "factored-model.safetensors"))
    b = load_file(str(tmp_path / "dev" / "factored-model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        x, y = a[k].double(), b[k].double()
        assert x.shape == y.shape
        assert ((x - y).abs() <= 2**-7 * x.abs().clamp_min(y.abs()) + 1e-30).all(), k
    ma = json.loads((tmp_path / "cpu" / "factored.json").read_text())
    mb = json.loads((tmp_path / "dev" / "factored.json").read_text())
    assert ma == mb


@pytest.mark.parametrize("device, msg", [("cuda", "torch sees no CUDA GPU"), ("tpu", "`device` must be")])
def test_an_unusable_device_is_one_line_and_nothing_written(f64_dir, tmp_path, device, msg):
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present")
    with pytest.raises(HeadRankError, match=msg):
        compress(str(f64_dir), tmp_path / "o", rank=2, device=device)
    r = CliRunner().invoke(app, ["compress", str(f64_dir), "--out", str(tmp_path / "o"), "--rank", "2",
                                 "--device", device])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "Traceback" not in r.output, r.output
    assert "--device" in r.output and not (tmp_path / "o").exists()


def test_a_model_type_transformers_does_not_build(bf16_dir, tmp_path):
    """The format choice asks transformers (imported beside the first layer): an unknown
    model_type is written dense with a note, and an explicit factored is one line, nothing written."""
    import shutil

    src = tmp_path / "src"
    shutil.copytree(bf16_dir, src)
    cfg = json.loads((src / "config.json").read_text())
    cfg["model_type"] = "not-a-transformers-type"
    (src / "config.json").write_text(json.dumps(cfg))
    layout = tmp_path / "lay.toml"
    layout.write_text('split = "separate"\nposition = "none"\n[tensors]\n' + "".join(
        f'{r} = "model.layers.{{i}}.self_attn.{r}_proj.weight"\n' for r in "qkvo") +
        "[sizes]\nn_layers = 2\nd_model = 64\nn_heads = 8\nn_kv_heads = 2\nhead_dim = 8\n")
    res = compress(str(src), tmp_path / "d", rank=2, layout=layout)
    assert res["checkpoint"]["format"] == "dense" and "transformers does not build" in res["notes"][-1]
    with pytest.raises(HeadRankError, match="use `format` dense"):
        compress(str(src), tmp_path / "f", rank=2, layout=layout, format="factored")
    assert not (tmp_path / "f").exists()


# -- shards written in the background -------------------------------------------------------
def test_shards_written_in_the_background_hold_the_single_files_tensors(bf16_dir, tmp_path, monkeypatch):
    """Shards of a few KiB (each written by the background thread while the next fills): the
    same tensors as one file, an index naming them, and load_compressed gives the same logits."""
    from safetensors import safe_open

    import headrank.compress.write as w

    one = compress(str(bf16_dir), tmp_path / "one", rank=3)
    monkeypatch.setattr(w, "SHARD_BYTES", 12_000)
    many = compress(str(bf16_dir), tmp_path / "many", rank=3)
    shards = [f for f in many["files"] if f.endswith(".safetensors")]
    assert len(shards) > 3 and "factored-model.safetensors.index.json" in many["files"]
    ref = load_file(str(tmp_path / "one" / "factored-model.safetensors"))
    got = {}
    for f in shards:
        with safe_open(str(tmp_path / "many" / f), "pt") as h:
            got.update({k: h.get_tensor(k) for k in h.keys()})
    assert got.keys() == ref.keys() and all(torch.equal(got[k], ref[k]) for k in ref)
    assert one["checkpoint"]["bytes_uncut"] > 0 and many["totals"] == one["totals"]
    ids = torch.tensor([[3, 14, 15, 9, 26, 53]])
    with torch.no_grad():
        a = hc.load_compressed(tmp_path / "one", dtype=torch.float64)(input_ids=ids).logits
        b = hc.load_compressed(tmp_path / "many", dtype=torch.float64)(input_ids=ids).logits
    assert torch.equal(a, b)


def test_a_background_write_that_fails_is_one_line_and_nothing_written(bf16_dir, tmp_path, monkeypatch):
    import safetensors.torch
    from safetensors import SafetensorError

    import headrank.compress.write as w

    real, calls = safetensors.torch.save_file, []

    def second_fails(tensors, path, metadata=None):
        calls.append(path)
        if len(calls) == 2:
            raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull }) (os error 28)")
        return real(tensors, path, metadata=metadata)

    monkeypatch.setattr(w, "SHARD_BYTES", 12_000)
    monkeypatch.setattr(w, "save_file", second_fails)
    r = CliRunner().invoke(app, ["compress", str(bf16_dir), "--out", str(tmp_path / "o"), "--rank", "2"])
    assert r.exit_code == 2 and "no space left on the device" in r.output and r.output.count("\n") == 1, r.output
    assert len(calls) == 2 and not (tmp_path / "o").exists()
