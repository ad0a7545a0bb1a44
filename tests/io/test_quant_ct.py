"""compressed-tensors checkpoints read exactly (headrank.io.quant_ct), against the library that
defines the format: a tiny random Llama's Linear weights quantized with compressed-tensors' own
``calculate_qparams`` and compressed by its compressors (pack-quantized W4A16 per group with zero
points and per channel, int-quantized W8 per channel, naive-quantized per tensor with a zero
point, float-quantized FP8 per channel and per ragged block); each dequantized weight, rounded to
the scale's dtype as the library rounds it, equals the library's ``decompress``, and the spectra
equal a dense float64 SVD of (code − zero point) × scale computed in the test from the library's
own unpacked codes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

ct = pytest.importorskip("compressed_tensors")
from compressed_tensors.compressors import BaseCompressor  # noqa: E402
from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32  # noqa: E402
from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme  # noqa: E402
from compressed_tensors.quantization.utils import calculate_qparams  # noqa: E402

from headrank.analysis.scan import analyze  # noqa: E402
from headrank.io.checkpoint import Checkpoint  # noqa: E402
from tests.io import quantlib as ql  # noqa: E402

H, KV, D = 4, 2, 72
CASES = {
    "w4a16-group-asym": ("pack-quantized", dict(num_bits=4, type="int", symmetric=False, strategy="group",
                                                group_size=8)),
    "w4a16-channel": ("pack-quantized", dict(num_bits=4, type="int", symmetric=True, strategy="channel")),
    "w8-channel": ("int-quantized", dict(num_bits=8, type="int", symmetric=True, strategy="channel")),
    "w8-tensor-asym": ("naive-quantized", dict(num_bits=8, type="int", symmetric=False, strategy="tensor")),
    "fp8-channel": ("float-quantized", dict(num_bits=8, type="float", symmetric=True, strategy="channel")),
    "fp8-block": ("float-quantized", dict(num_bits=8, type="float", symmetric=True, strategy="block",
                                          block_structure=[32, 32])),
}


def _qparams(w, a):
    if a.strategy == "tensor":
        mn, mx = w.min().reshape(1), w.max().reshape(1)
    elif a.strategy == "channel":
        mn, mx = w.amin(1, keepdim=True), w.amax(1, keepdim=True)
    elif a.strategy == "group":
        g = w.unflatten(1, (-1, a.group_size))
        mn, mx = g.amin(-1), g.amax(-1)
    else:
        from compressed_tensors.quantization.utils import maybe_pad_tensor_for_block_quant

        b = maybe_pad_tensor_for_block_quant(w, tuple(a.block_structure))
        b = b.unflatten(0, (-1, a.block_structure[0])).unflatten(2, (-1, a.block_structure[1]))
        mn, mx = b.amin((1, 3)), b.amax((1, 3))
    return calculate_qparams(mn, mx, a)


def write_ct(model, path, fmt, args):
    """The model's layer Linears compressed by compressed-tensors; (library's decompressed weights,
    dense float64 reference from the library's unpacked codes)."""
    a = QuantizationArgs(**args)
    scheme = QuantizationScheme(targets=["Linear"], weights=a, format=fmt)
    comp = BaseCompressor.get_value_from_registry(fmt)
    out, lib, ref = {}, {}, {}
    for n, t in model.state_dict().items():
        t = t.detach().float().contiguous()
        if not ql.quantized(n):
            out[n], ref[n] = t, t.double().numpy()
            continue
        s, z = _qparams(t, a)
        c = comp.compress({"weight": t, "weight_scale": s, "weight_zero_point": z}, scheme)
        m = n[: -len(".weight")]
        out.update({f"{m}.{k}": v.contiguous() for k, v in c.items()})
        lib[n] = comp.decompress(c, scheme)["weight"]
        ref[n] = _reference(c, a, fmt, tuple(t.shape))
    path.mkdir(parents=True, exist_ok=True)
    save_file(out, str(path / "model.safetensors"))
    cfg = model.config.to_dict()
    qc = QuantizationConfig(config_groups={"group_0": scheme}, format=fmt, quantization_status="compressed",
                            ignore=["lm_head"])
    cfg["quantization_config"] = qc.model_dump(mode="json", exclude_none=True)
    (path / "config.json").write_text(json.dumps(cfg))
    return lib, ref


def _reference(c, a, fmt, shape):
    """(code − zero point) × scale in float64, element by element from the library's own unpacking."""
    if fmt == "pack-quantized":
        q = unpack_from_int32(c["weight_packed"], a.num_bits, torch.Size(shape)).double().numpy()
    else:
        q = c["weight"].double().numpy()
    s = c["weight_scale"].double().numpy()
    z = c.get("weight_zero_point")
    if z is not None and fmt == "pack-quantized":
        z = unpack_from_int32(z, a.num_bits, torch.Size((shape[0], s.shape[1])), packed_dim=0)
    z = np.zeros_like(s) if z is None else z.double().numpy().reshape(s.shape)
    out = np.empty(shape)
    for i in range(shape[0]):
        for j in range(shape[1]):
            if a.strategy == "tensor":
                k = (0,) * s.ndim
            elif a.strategy == "channel":
                k = (i, 0)
            elif a.strategy == "group":
                k = (i, j // a.group_size)
            else:
                k = (i // a.block_structure[0], j // a.block_structure[1])
            out[i, j] = (q[i, j] - z[k]) * s[k]
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("ct")
    model = ql.llama(hidden=D, heads=H, kv=KV)
    return {case: (root / case, *write_ct(model, root / case, fmt, args)) for case, (fmt, args) in CASES.items()}


@pytest.mark.parametrize("case", list(CASES))
def test_equals_the_library_and_dense_float64(built, case):
    path, lib, ref = built[case]
    with Checkpoint(path) as ck:
        assert not [k for k in ck.keys() if k.endswith(("_scale", "_zero_point", "_shape", "_packed"))]
        for n, want in lib.items():
            got = ck.get(n)
            assert got.dtype == torch.float64
            np.testing.assert_array_equal(got.to(want.dtype).numpy(), want.numpy())  # the library's rounding
            np.testing.assert_array_equal(got.numpy(), ref[n])  # exact: (code - zero point) x scale
    res = analyze(path)
    for layer in (0, 1):
        want = ql.head_spectra(ref, layer, H, KV, D // H)
        for p in ("qk", "ov"):
            got = res.sv[p][layer]
            assert np.max(np.abs(got - want[p])) / np.max(want[p]) < 1e-12
    q = res.meta["quantization"]
    assert q["method"] == "compressed-tensors" and q["dequantized"] is True and CASES[case][0] in q["scheme"]


def test_bad_input_one_line(built, tmp_path):
    from safetensors.torch import load_file

    path = built["w4a16-group-asym"][0]
    t = load_file(str(path / "model.safetensors"))
    cfg = json.loads((path / "config.json").read_text())
    m = "model.layers.0.self_attn.q_proj"
    cases = {
        "zero point missing": (lambda t, c: t.pop(f"{m}.weight_zero_point"), "weight_zero_point is missing"),
        "scale shape": (lambda t, c: t.update({f"{m}.weight_scale": t[f"{m}.weight_scale"][:, :1].contiguous()}),
                        "has shape"),
        "packed length": (lambda t, c: t.update({f"{m}.weight_shape": torch.tensor([72, 80])}), "does not match its "
                          "weight_shape"),
        "3-bit": (lambda t, c: c["quantization_config"]["config_groups"]["group_0"]["weights"].update(num_bits=3),
                  "3-bit packed codes are not read"),
        "nvfp4": (lambda t, c: c["quantization_config"].update(format="nvfp4-pack-quantized") or
                  c["quantization_config"]["config_groups"]["group_0"].update(format="nvfp4-pack-quantized"),
                  "'nvfp4-pack-quantized'"),
        "scale NaN": (lambda t, c: t[f"{m}.weight_scale"].fill_(float("nan")), "NaN or infinite"),
    }
    ql.each_refused(tmp_path, t, cfg, cases)
