"""Safe, lazy checkpoint reading: shards, bf16, PyTorch pickles, and every bad input."""

import pickle
import shutil

import pytest
import torch
from safetensors.torch import load_file

from headrank.errors import HeadRankError
from headrank.io.checkpoint import Checkpoint

from ..helpers import shard


def test_shipped_and_sharded_bf16(tmp_path, minilm_dir):
    d = shard(minilm_dir, tmp_path / "sh", dtype=torch.bfloat16)
    with Checkpoint(d) as c, Checkpoint("minilm") as ref:
        name = "encoder.layer.3.attention.self.key.weight"
        assert len(c.files) == 3 and c.dtype(name) == "bfloat16"
        t = c.get(name)
        assert t.dtype == torch.bfloat16
        torch.testing.assert_close(t, ref.get(name).to(torch.bfloat16), rtol=0, atol=0)


def test_torch_bin_through_weights_only(tmp_path, minilm_dir):
    sd = load_file(minilm_dir / "model.safetensors")
    torch.save(sd, tmp_path / "pytorch_model.bin")
    shutil.copy(minilm_dir / "config.json", tmp_path)
    with Checkpoint(tmp_path) as c:
        name = "encoder.layer.0.attention.self.query.weight"
        torch.testing.assert_close(c.get(name), sd[name], rtol=0, atol=0)


class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("fmt", ["zip", "legacy"])
def test_crafted_pickle_does_not_run(tmp_path, minilm_dir, fmt):
    marker = tmp_path / "pwned"
    payload = {"x": _Exploit(str(marker))}
    if fmt == "zip":  # torch.save's own container, pickle inside
        torch.save(payload, tmp_path / "pytorch_model.bin")
    else:
        with open(tmp_path / "pytorch_model.bin", "wb") as fh:
            pickle.dump(payload, fh)
    shutil.copy(minilm_dir / "config.json", tmp_path)
    with pytest.raises(HeadRankError, match="refused"):
        Checkpoint(tmp_path)
    assert not marker.exists()


@pytest.mark.parametrize("case", ["missing", "empty_dir", "no_config", "truncated", "garbage",
                                  "bad_index", "missing_shard", "bad_config", "single_file_no_config"])
def test_bad_sources_raise_one_clear_error(tmp_path, minilm_dir, case):
    src = minilm_dir / "model.safetensors"
    d = tmp_path / "m"
    d.mkdir()
    shutil.copy(minilm_dir / "config.json", d)
    target = d
    if case == "missing":
        target = tmp_path / "nope"
    elif case == "empty_dir":
        (d / "config.json").unlink()
    elif case == "no_config":
        shutil.copy(src, d)
        (d / "config.json").unlink()
    elif case == "truncated":
        data = src.read_bytes()
        (d / "model.safetensors").write_bytes(data[: len(data) // 2])
    elif case == "garbage":
        (d / "model.safetensors").write_bytes(b"\x00" * 100)
    elif case == "bad_index":
        (d / "model.safetensors.index.json").write_text("{not json")
    elif case == "missing_shard":
        shard(minilm_dir, d, n_shards=2)
        (d / "model-00002-of-00002.safetensors").unlink()
    elif case == "bad_config":
        shutil.copy(src, d)
        (d / "config.json").write_text("[1, 2")
    elif case == "single_file_no_config":
        target = tmp_path / "lonely.safetensors"
        shutil.copy(src, target)
    with pytest.raises(HeadRankError) as e:
        Checkpoint(target)
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 400


def test_single_file_with_explicit_config(tmp_path, minilm_dir):
    f = tmp_path / "weights.safetensors"
    shutil.copy(minilm_dir / "model.safetensors", f)
    with Checkpoint(f, config=minilm_dir / "config.json") as c:
        assert "encoder.layer.5.attention.output.dense.weight" in c


def test_a_shipped_name_that_is_also_a_path_here_is_refused_not_chosen_silently(tmp_path, minilm_dir):
    """With ./minilm (a saved model) and ./smollm2 in the cwd, ``spectra minilm`` read the shipped
    MiniLM and said nothing: one of two models chosen silently. Now one line naming both, exit 2,
    nothing written; ``./minilm`` reads the local one."""
    import subprocess
    import sys

    (tmp_path / "minilm").mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(minilm_dir / f, tmp_path / "minilm" / f)
    (tmp_path / "smollm2").write_bytes(b"")
    for name in ("minilm", "smollm2"):
        r = subprocess.run([sys.executable, "-m", "headrank", "spectra", name, "--layers", "0", "--out", "o"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stdout + r.stderr
        assert "names both the shipped model" in r.stderr and str(tmp_path / name) in r.stderr
        assert not (tmp_path / "o").exists()
    r = subprocess.run([sys.executable, "-m", "headrank", "spectra", "./minilm", "--layers", "0"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    # a headrank output of tables and figures (``spectra minilm --out minilm``, run twice) holds no model
    (tmp_path / "again").mkdir()
    for _ in range(2):
        r = subprocess.run([sys.executable, "-m", "headrank", "spectra", "minilm", "--layers", "0", "--out", "minilm"],
                           cwd=tmp_path / "again", capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
