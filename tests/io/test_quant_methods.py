"""Every quantization method transformers knows is read exactly or refused in one line
(headrank.io.schemes): the names come from transformers itself (``QuantizationMethod`` and
``AUTO_QUANTIZATION_CONFIG_MAPPING``), so a method added there is walked here too. A method that
is read has its own exactness tests (test_quant_fp8.py, test_quant_ct.py, test_quant_int.py); with plain float
tensors under its config it is refused as a contradiction. Every other method is refused by
name, whatever the tensors hold."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file
from transformers.quantizers.auto import AUTO_QUANTIZATION_CONFIG_MAPPING
from transformers.utils.quantization_config import QuantizationMethod

from headrank.analysis.scan import analyze
from headrank.errors import HeadRankError
from headrank.io.schemes import KNOWN
from tests.io import quantlib as ql

METHODS = sorted({m.value for m in QuantizationMethod} | set(AUTO_QUANTIZATION_CONFIG_MAPPING))
READ = {"fp8": "test_quant_fp8.py", "fbgemm_fp8": "test_quant_fp8.py", "compressed-tensors": "test_quant_ct.py",
        "gptq": "test_quant_int.py", "awq": "test_quant_int.py"}


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    d = tmp_path_factory.mktemp("plain")
    m = ql.llama(hidden=32, heads=4, kv=2, layers=1)
    save_file({n: t.contiguous() for n, t in m.state_dict().items()}, str(d / "model.safetensors"))
    return d, m.config.to_dict()


def _config(method):
    if method.startswith("bitsandbytes"):
        return {"quant_method": "bitsandbytes", "load_in_4bit": method != "bitsandbytes_8bit",
                "load_in_8bit": method == "bitsandbytes_8bit"}
    if method == "compressed-tensors":
        return {"quant_method": method, "format": "pack-quantized", "quantization_status": "compressed",
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int",
                                                                                  "strategy": "group",
                                                                                  "group_size": 8}}}}
    if method in ("gptq", "awq"):
        return {"quant_method": method, "bits": 4, "group_size": 16}
    return {"quant_method": method, "weight_block_size": [16, 16]} if method == "fp8" else {"quant_method": method}


def test_transformers_methods_are_all_known():
    assert len(METHODS) >= 25 and set(METHODS) <= set(KNOWN), set(METHODS) - set(KNOWN)


@pytest.mark.parametrize("method", METHODS)
def test_every_method_read_exactly_or_refused_in_one_line(plain, tmp_path, method):
    src, cfg = plain
    (tmp_path / "model.safetensors").symlink_to(src / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "quantization_config": _config(method)}))
    with pytest.raises(HeadRankError) as e:
        analyze(tmp_path)
    msg = str(e.value)
    assert "\n" not in msg
    if method in READ:  # read exactly elsewhere; here its config contradicts the plain tensors
        assert "contradicts the tensors" in msg, msg
    else:
        name = "bitsandbytes" if method.startswith("bitsandbytes") else method
        assert f"quant_method {name!r}" in msg and "is not read by headrank" in msg, msg


def test_refusal_from_the_command_line_exit_2(plain, tmp_path):
    src, cfg = plain
    d = tmp_path / "hqq model"
    d.mkdir()
    (d / "model.safetensors").symlink_to(src / "model.safetensors")
    (d / "config.json").write_text(json.dumps({**cfg, "quantization_config": {"quant_method": "hqq", "nbits": 4}}))
    r = subprocess.run([sys.executable, "-m", "headrank", "spectra", "hqq model", "--no-plots", "--out", "o"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    errors = [ln for ln in r.stderr.strip().splitlines() if not ln.startswith("layers ")]  # progress lines aside
    assert r.returncode == 2 and len(errors) == 1 and "'hqq'" in errors[0], r.stderr
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_integer_codes_without_a_config_are_refused(plain, tmp_path):
    """GPTQ-like int32 tensors stored under the weight's own name, no quantization_config: refused."""
    src, cfg = plain
    from safetensors.torch import load_file

    t = load_file(str(src / "model.safetensors"))
    n = "model.layers.0.self_attn.v_proj.weight"
    t[n] = torch.randint(-8, 8, tuple(t[n].shape), dtype=torch.int8)
    save_file(t, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(HeadRankError, match="is stored as int8: quantization codes"):
        analyze(tmp_path)
