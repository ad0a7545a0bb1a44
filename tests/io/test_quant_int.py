"""GPTQ and AWQ checkpoints read exactly (headrank.io.quant_int). No GPTQ or AWQ library runs
here, so the checkpoints are packed in this test, element by element, following the published
formats: AutoGPTQ's ``QuantLinear.pack`` (auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py:
``qweight`` [in·bits/32, out], input ``i`` of word ``i // (32/bits)`` at bits ``bits·(i mod
32/bits)``; ``qzeros`` [groups, out·bits/32] packed along the outputs, storing z − 1; ``scales``
[groups, out] float16; ``g_idx`` [in]) and GPTQModel's ``gptq_v2`` (zeros stored as they are);
AutoAWQ's ``WQLinear_GEMM.from_linear`` (awq/modules/linear/gemm.py: ``qweight`` [in, out/8],
output ``8c + [0, 2, 4, 6, 1, 3, 5, 7][j]`` at bits 4j of word c; ``qzeros`` the same;
``scales`` [groups, out]). The reference weights are computed here with loops,
``W[o, i] = scale[g(i), o] · (q[i, o] − z[g(i), o])`` in float64, and the spectra compared with a
dense float64 SVD of them to 1e-12."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from headrank.analysis.scan import analyze
from headrank.errors import HeadRankError
from headrank.io.checkpoint import Checkpoint
from tests.io import quantlib as ql

H, KV, D = 4, 2, 64
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def _words(codes: np.ndarray, bits: int, axis: int, order=None) -> np.ndarray:
    """Pack unsigned ``codes`` 32/bits per int32 along ``axis``, one element at a time."""
    per = 32 // bits
    c = np.moveaxis(codes, axis, 0)
    out = np.zeros((c.shape[0] // per, *c.shape[1:]), dtype=np.uint32)
    for w in range(out.shape[0]):
        for j in range(per):
            src = w * per + (order[j] if order else j)
            out[w] |= c[src].astype(np.uint32) << np.uint32(bits * j)
    return np.ascontiguousarray(np.moveaxis(out, 0, axis)).view(np.int32)


def _layer(rng, out, inp, method, bits, gs, desc_act, fmt):
    q = rng.integers(0, 1 << bits, size=(inp, out))
    groups = 1 if gs == -1 else inp // gs
    z = rng.integers(0, 1 << bits, size=(groups, out))
    s = (rng.random((groups, out)) * 0.02 + 0.001).astype(np.float16)
    if desc_act:  # act-order: inputs in a random order fill the groups one after another
        g = np.empty(inp, dtype=np.int32)
        g[rng.permutation(inp)] = np.arange(inp) // gs
    else:
        g = (np.arange(inp) // (inp if gs == -1 else gs)).astype(np.int32)
    ref = np.empty((out, inp))
    for i in range(inp):
        for o in range(out):
            ref[o, i] = float(s[g[i], o]) * (q[i, o] - z[g[i], o])
    if method == "gptq":
        stored_z = z - 1 if fmt == "gptq" else z
        t = {"qweight": _words(q, bits, 0), "qzeros": _words(stored_z & ((1 << bits) - 1), bits, 1),
             "scales": s, "g_idx": g}
    else:
        t = {"qweight": _words(q, bits, 1, AWQ_ORDER), "qzeros": _words(z, bits, 1, AWQ_ORDER), "scales": s}
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in t.items()}, ref


def write(path, method, bits=4, gs=16, desc_act=False, fmt="gptq", seed=0):
    model = ql.llama(hidden=D, heads=H, kv=KV, layers=2, seed=seed)
    rng = np.random.default_rng(seed)
    out, ref = {}, {}
    for n, t in model.state_dict().items():
        if ql.quantized(n):
            m = n[: -len(".weight")]
            packed, r = _layer(rng, t.shape[0], t.shape[1], method, bits, gs, desc_act, fmt)
            out.update({f"{m}.{k}": v for k, v in packed.items()})
            ref[n] = r
        else:
            out[n], ref[n] = t.contiguous(), t.double().numpy()
    path.mkdir(parents=True, exist_ok=True)
    save_file(out, str(path / "model.safetensors"))
    qc = {"quant_method": method, "bits": bits, "group_size": gs}
    qc.update({"desc_act": desc_act, "sym": False, "checkpoint_format": fmt} if method == "gptq" else
              {"zero_point": True, "version": "gemm"})
    (path / "config.json").write_text(json.dumps({**model.config.to_dict(), "quantization_config": qc}))
    return ref


CASES = {"gptq-v1-4bit": dict(method="gptq"), "gptq-v1-desc-act": dict(method="gptq", desc_act=True),
         "gptq-v2-8bit-one-group": dict(method="gptq", bits=8, gs=-1, fmt="gptq_v2"),
         "gptq-v1-2bit": dict(method="gptq", bits=2), "awq-gemm": dict(method="awq")}


@pytest.mark.parametrize("case", list(CASES))
def test_equals_the_published_format_and_dense_float64(tmp_path, case):
    ref = write(tmp_path / case, **CASES[case])
    with Checkpoint(tmp_path / case) as ck:
        assert not [k for k in ck.keys() if k.endswith((".qweight", ".qzeros", ".scales", ".g_idx"))]
        for n in ref:
            if ql.quantized(n):
                np.testing.assert_array_equal(ck.get(n).numpy(), ref[n])
    res = analyze(tmp_path / case)
    for layer in (0, 1):
        want = ql.head_spectra(ref, layer, H, KV, D // H)
        for p in ("qk", "ov"):
            assert np.max(np.abs(res.sv[p][layer] - want[p])) / np.max(want[p]) < 1e-12
    assert res.meta["quantization"]["method"] == CASES[case]["method"]


def test_bad_input_one_line(tmp_path):
    from safetensors.torch import load_file

    src = tmp_path / "src"
    write(src, "gptq", desc_act=True)
    t, cfg = load_file(str(src / "model.safetensors")), json.loads((src / "config.json").read_text())
    m = "model.layers.0.self_attn.k_proj"
    cases = {
        "g_idx out of range": (lambda t, c: t[f"{m}.g_idx"].__setitem__(0, 99), "names groups outside"),
        "qzeros shape": (lambda t, c: t.update({f"{m}.qzeros": t[f"{m}.qzeros"][:, :1].contiguous()}), "has shape"),
        "scales missing": (lambda t, c: t.pop(f"{m}.scales"), "scales is missing"),
        "scales NaN": (lambda t, c: t[f"{m}.scales"].fill_(float("nan")), "NaN or infinite"),
        "3-bit": (lambda t, c: c["quantization_config"].update(bits=3), "bits 3"),
        "exllama format": (lambda t, c: c["quantization_config"].update(checkpoint_format="marlin"), "'marlin'"),
        "group size": (lambda t, c: [t.pop(k) for k in list(t) if k.endswith(".g_idx")] and
                       c["quantization_config"].update(group_size=32, desc_act=False), "the group size does not match"),
    }
    ql.each_refused(tmp_path, t, cfg, cases)


def test_a_config_that_contradicts_the_tensors_is_refused(tmp_path):
    """The red team's cases: GPTQ whose group_size -1 (one group) meets several scale rows and a
    g_idx (the scale count was not checked with a g_idx); AWQ whose config says zero_point false
    while qzeros holds other zero points than 2^(bits-1). Each one line, never a guess."""
    gptq = tmp_path / "gptq"
    write(gptq, "gptq", desc_act=True)
    cfg = json.loads((gptq / "config.json").read_text())
    cfg["quantization_config"].update(group_size=-1)
    (gptq / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(HeadRankError, match="the group size does not match"):
        analyze(gptq)
    awq = tmp_path / "awq"
    write(awq, "awq")  # random zero points
    cfg = json.loads((awq / "config.json").read_text())
    cfg["quantization_config"].update(zero_point=False)
    (awq / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(HeadRankError, match="zero_point false") as e:
        analyze(awq)
    assert "\n" not in str(e.value)
