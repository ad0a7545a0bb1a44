"""Hostile files meet one validation layer: each case is one HeadRankError naming the file.

Cases from issue 20: sizes in config.json (0 heads, Infinity, 1e30 / 1e9 layers, true heads,
8.9 width, deep nesting), shard indexes (a list weight_map, paths leaving the checkpoint), TOML
layouts (split as a list, {x}, {i.__class__}), complex weights, FIFOs named like weights or
configs, permission errors, and sizes this machine cannot hold.
"""

import json
import os
import stat

import pytest
import torch
from safetensors.torch import save_file

from headrank.errors import HeadRankError
from headrank.io import validate
from headrank.io.sources import open_reader
from tests.fuzz.harness import time_limit

from ..fuzz.harness import TINY_CONFIG, tiny_tensors, write_tiny


@pytest.fixture
def limit():
    """Fail (rather than hang the suite) when a read blocks for 20 s."""
    with time_limit(20):
        yield


def _open_with(tmp_path, **changes):
    src = write_tiny(tmp_path / "m", {**TINY_CONFIG, **changes})
    return open_reader(str(src))


@pytest.mark.parametrize("changes, needle", [
    ({"model_type": "falcon", "num_attention_heads": 0}, "num_attention_heads must lie in 1.."),
    ({"num_attention_heads": 0}, "num_attention_heads must lie in 1.."),
    ({"hidden_size": float("inf")}, "hidden_size must be an integer; got inf"),
    ({"head_dim": float("inf")}, "head_dim must be an integer; got inf"),
    ({"num_hidden_layers": 1e30}, "num_hidden_layers must lie in 1..100000"),
    ({"num_hidden_layers": 1e9}, "num_hidden_layers must lie in 1..100000"),
    ({"num_attention_heads": True}, "num_attention_heads must be an integer; got True"),
    ({"hidden_size": 8.9}, "hidden_size must be an integer; got 8.9"),
    ({"hidden_size": "8"}, "hidden_size must be an integer; got '8'"),
    ({"num_hidden_layers": 3}, "gives 3 layers but the checkpoint has no tensor"),
])
def test_config_sizes_are_checked(tmp_path, changes, needle):
    with pytest.raises(HeadRankError, match=None) as e:
        _open_with(tmp_path, **changes)
    assert needle in str(e.value) and str(tmp_path / "m" / "config.json") in str(e.value)
    assert "\n" not in str(e.value)


def test_integral_float_sizes_are_accepted(tmp_path):
    r = _open_with(tmp_path, hidden_size=8.0, num_attention_heads=2.0)
    assert (r.dims.d, r.dims.n_heads, r.dims.head_dim) == (8, 2, 4)


def test_deeply_nested_config_is_one_line(tmp_path):
    src = write_tiny(tmp_path / "m")
    (src / "config.json").write_text("[" * 100_000)
    with pytest.raises(HeadRankError, match="nested too deeply"):
        open_reader(str(src))


def test_sizes_this_machine_cannot_hold_are_refused_before_allocating(tmp_path, monkeypatch):
    monkeypatch.setattr(validate, "memory_bytes", lambda: 1 << 30)  # a 1 GiB machine
    src = write_tiny(tmp_path / "m", {**TINY_CONFIG, "hidden_size": 65536, "num_attention_heads": 64})
    with pytest.raises(HeadRankError, match=r"would need .* GiB of memory; this machine has 1 GiB"):
        open_reader(str(src))


def _sharded(tmp_path, weight_map):
    src = tmp_path / "m"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(TINY_CONFIG))
    save_file(tiny_tensors(), src / "model-1.safetensors")
    save_file(tiny_tensors(), tmp_path / "other.safetensors")
    (src / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return src


@pytest.mark.parametrize("weight_map, needle", [
    (["model-1.safetensors"], "weight_map must be a non-empty object"),
    ("model-1.safetensors", "weight_map must be a non-empty object"),
    ({}, "weight_map must be a non-empty object"),
    ({n: "../other.safetensors" for n in tiny_tensors()}, "lies outside the checkpoint directory"),
    ({n: "/etc/passwd" for n in tiny_tensors()}, "lies outside the checkpoint directory"),
    ({n: "x/../../other.safetensors" for n in tiny_tensors()}, "lies outside the checkpoint directory"),
    ({n: 3 for n in tiny_tensors()}, "a file name must be a non-empty string"),
])
def test_shard_index_is_checked(tmp_path, weight_map, needle):
    with pytest.raises(HeadRankError) as e:
        open_reader(str(_sharded(tmp_path, weight_map)))
    assert needle in str(e.value)


def test_shard_index_inside_the_checkpoint_still_reads(tmp_path):
    r = open_reader(str(_sharded(tmp_path, {n: "./sub/../model-1.safetensors" for n in tiny_tensors()})))
    assert r.read_layer(1).wq.shape == (2, 4, 8)


_TOML = ('split = {split}\n[tensors]\nq = "{q}"\nk = "encoder.layer.{{i}}.attention.self.key.weight"\n'
         'v = "encoder.layer.{{i}}.attention.self.value.weight"\no = "encoder.layer.{{i}}.attention.output.dense.weight"\n'
         "[sizes]\nn_layers = 2\nd_model = 8\nn_heads = 2\n")


@pytest.mark.parametrize("split, q, needle", [
    ('["separate"]', "encoder.layer.{i}.attention.self.query.weight", "split must be a string"),
    ('"separate"', "x.{x}.weight", "may use only {i}"),
    ('"separate"', "x.{i.__class__}.weight", "may use only {i}"),
    ('"separate"', "x.{i!r}.weight", "may use only {i}"),
    ('"separate"', "x.{i:>9}.weight", "may use only {i}"),
    ('"separate"', "x.{}.weight", "may use only {i}"),
    ('"separate"', "x.weight", "must contain {i}"),
])
def test_toml_layout_schema(tmp_path, split, q, needle):
    from headrank.io.layout_toml import layout_from_toml

    p = tmp_path / "l.toml"
    p.write_text(_TOML.format(split=split, q=q))
    with pytest.raises(HeadRankError) as e:
        layout_from_toml(p)
    assert needle in str(e.value) and str(p) in str(e.value)
    assert "class" not in str(e.value).replace("__class__", "")  # the field was never evaluated


@pytest.mark.parametrize("extra, needle", [
    ("oops = 1\n", "unknown key 'oops'"),
    ('position = "sideways"\n', "position must be one of"),
    ("qk_norm = 1\n", "qk_norm must be true or false"),
])
def test_toml_layout_top_level_keys(tmp_path, extra, needle):
    from headrank.io.layout_toml import layout_from_toml

    p = tmp_path / "l.toml"
    p.write_text(extra + _TOML.format(split='"separate"', q="encoder.layer.{i}.attention.self.query.weight"))
    with pytest.raises(HeadRankError, match=needle):
        layout_from_toml(p)


def test_toml_sizes_are_integers(tmp_path):
    from headrank.io.layout_toml import layout_from_toml

    p = tmp_path / "l.toml"
    good = _TOML.format(split='"separate"', q="encoder.layer.{i}.attention.self.query.weight")
    for bad, needle in (("d_model = 8.5", "d_model must be an integer"), ("d_model = inf", "d_model must be an integer"),
                        ("d_model = true", "d_model must be an integer"), ("d_model = 0", "d_model must lie in")):
        p.write_text(good.replace("d_model = 8", bad))
        with pytest.raises(HeadRankError, match=needle):
            layout_from_toml(p)


def test_complex_weights_are_refused(tmp_path):
    src = write_tiny(tmp_path / "m")
    t = {k: v.to(torch.complex64) for k, v in tiny_tensors().items()}
    save_file(t, src / "model.safetensors")
    r = open_reader(str(src))
    with pytest.raises(HeadRankError, match="has dtype complex64: attention weights must be real"):
        r.read_layer(0)


@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])
def test_a_fifo_never_hangs(tmp_path, name, limit):
    src = write_tiny(tmp_path / "m")
    (src / name).unlink()
    os.mkfifo(src / name)
    with pytest.raises(HeadRankError, match="is not a regular file \\(a FIFO\\)"):
        open_reader(str(src))


def test_a_fifo_as_the_source_or_a_layout_never_hangs(tmp_path, limit):
    fifo = tmp_path / "weights.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(HeadRankError, match="not a regular file"):
        open_reader(str(fifo), config=TINY_CONFIG)
    with pytest.raises(HeadRankError, match="not a regular file"):
        open_reader("minilm", layout=str(fifo))
    sniff = tmp_path / "model"  # no suffix: the GGUF sniffing must not open it either
    os.mkfifo(sniff)
    with pytest.raises(HeadRankError):
        open_reader(str(sniff))


def _deny(monkeypatch, target):
    """Simulate a file the user may not read (the suite may run as root, who may read anything)."""
    real_stat, real_open = os.stat, os.open

    def fake_open(path, flags, *a, **k):
        if str(path) == str(target):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *a, **k)

    monkeypatch.setattr(os, "open", fake_open)
    return real_stat


def test_permission_denied_names_the_path(tmp_path, monkeypatch):
    src = write_tiny(tmp_path / "m")
    _deny(monkeypatch, src / "model.safetensors")
    with pytest.raises(HeadRankError) as e:
        open_reader(str(src))
    assert str(e.value) == f"permission denied: cannot read the weights file {src / 'model.safetensors'}"


def test_permission_denied_on_the_config_is_not_no_such_file(tmp_path, monkeypatch):
    src = write_tiny(tmp_path / "m")
    real_open = os.open  # every planted file is read through os.open (validate.read_bytes)

    def fake_open(path, *a, **k):
        if str(path) == str(src / "config.json"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *a, **k)

    monkeypatch.setattr(os, "open", fake_open)
    with pytest.raises(HeadRankError) as e:
        open_reader(str(src))
    assert "permission denied" in str(e.value) and "No such file" not in str(e.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_permission_denied_for_real(tmp_path):
    src = write_tiny(tmp_path / "m")
    os.chmod(src / "model.safetensors", 0)
    try:
        with pytest.raises(HeadRankError, match="permission denied"):
            open_reader(str(src))
        os.chmod(src / "model.safetensors", stat.S_IRUSR | stat.S_IWUSR)
        os.chmod(src, 0)
        with pytest.raises(HeadRankError, match="permission denied"):
            open_reader(str(src))
    finally:
        os.chmod(src, 0o755)


@pytest.mark.parametrize("value, ok", [(3, True), (3.0, True), (True, False), (3.5, False), (float("nan"), False),
                                       (float("inf"), False), ("3", False), (None, False), (0, False), (10**30, False)])
def test_as_int(value, ok):
    if ok:
        assert validate.as_int(value, "n", "w", hi=100) == 3
    else:
        with pytest.raises(HeadRankError):
            validate.as_int(value, "n", "w", hi=100)


def test_tensor_pattern_allows_literal_braces():
    assert validate.tensor_pattern("a.{{x}}.{i}", "w").format(i=3) == "a.{x}.3"


def test_a_directory_the_user_may_not_list_names_the_path(tmp_path, monkeypatch):
    src = write_tiny(tmp_path / "m")
    (src / "model.safetensors").rename(src / "weights.bin")  # found only by listing the directory
    real = os.listdir

    def fake(path="."):
        if str(path) == str(src):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "listdir", fake)
    with pytest.raises(HeadRankError) as e:
        open_reader(str(src))
    assert str(e.value) == f"permission denied: cannot read {src}"


# -- issue 27: tensors in .bin pickles, LoRA shapes, Hub cache refs, FIFOs in every reader --------
def _bin(tmp_path, change):
    d = tmp_path / "bin"
    d.mkdir()
    t = tiny_tensors()
    k = next(iter(t))
    t[k] = change(t[k])
    torch.save(t, d / "pytorch_model.bin")
    (d / "config.json").write_text(json.dumps(TINY_CONFIG))
    return d


@pytest.mark.parametrize("change, needle", [
    (lambda w: w.to_sparse(), "is a sparse tensor (sparse_coo)"),
    (lambda w: w.to_sparse_csr(), "is a sparse tensor (sparse_csr)"),
    (lambda w: torch.quantize_per_tensor(w, 0.1, 0, torch.qint8), "is a quantized tensor (qint8)"),
    (lambda w: torch.empty(8, 8, device="meta"), "is a meta tensor"),
])
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_bin_with_a_tensor_that_is_not_dense_data(tmp_path, change, needle):
    from ..fuzz.harness import check_outcome, run_cli

    d = _bin(tmp_path, change)
    with pytest.raises(HeadRankError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        open_reader(str(d))
    code, _, err = run_cli("spectra", str(d))
    check_outcome(code, err)
    assert code == 2 and "encoder.layer.0.attention.self.query.weight" in err


def _lora(tmp_path, a, b):
    from safetensors.torch import save_file as save

    base = write_tiny(tmp_path / "base")
    ad = tmp_path / "lora"
    ad.mkdir()
    (ad / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 4,
                                                        "base_model_name_or_path": str(base)}))
    pre = "base_model.model.encoder.layer.0.attention.self.query"
    save({f"{pre}.lora_A.weight": a, f"{pre}.lora_B.weight": b}, ad / "adapter_model.safetensors")
    return ad


@pytest.mark.parametrize("a, b, needle", [
    (torch.tensor(1.0), torch.zeros(8, 2), r"lora_A.weight has shape \(\); a LoRA A matrix is rank x in"),
    (torch.zeros(0, 8), torch.zeros(8, 0), r"has shape \(0, 8\)"),
    (torch.zeros(2, 8), torch.zeros(8, 3), r"no matching lora_B of rank 2 .*shape \(8, 3\)"),
    (torch.zeros(2, 8), torch.tensor(0.5), r"no matching lora_B of rank 2 .*shape \(\)"),
])
def test_lora_shapes_are_one_line(tmp_path, a, b, needle):
    from ..fuzz.harness import check_outcome, run_cli

    ad = _lora(tmp_path, a, b)
    with pytest.raises(HeadRankError, match=needle):
        open_reader(str(ad))
    code, _, err = run_cli("spectra", str(ad))
    check_outcome(code, err)
    assert code == 2


def _cache(tmp_path, monkeypatch, ref_text=None):
    """A Hugging Face cache holding org/tiny at commit a*40, with refs/main as given."""
    cache = tmp_path / "hub"
    root = cache / "models--org--tiny"
    write_tiny(root / "snapshots" / ("a" * 40))
    (root / "refs").mkdir(parents=True)
    if ref_text is not None:
        (root / "refs" / "main").write_text(ref_text)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    return root


def test_hub_ref_is_read_only_inside_the_cache(tmp_path, monkeypatch, limit):
    root = _cache(tmp_path, monkeypatch, "a" * 40)
    assert open_reader("org/tiny").ckpt.path == root / "snapshots" / ("a" * 40)
    outside = tmp_path / "outside"
    write_tiny(outside)  # a model the ref points at, three levels up: never read
    (root / "refs" / "main").write_text("../../../outside")
    with pytest.raises(HeadRankError, match=r"refs/main holds '../../../outside', not a commit hash"):
        open_reader("org/tiny")
    (root / "refs" / "main").write_text("a" * 40 + "\n")
    with pytest.raises(HeadRankError, match="not a commit hash"):
        open_reader("org/tiny")
    for rev in ("../../../outside", "/etc", "v1/../../x"):
        with pytest.raises(HeadRankError, match="is not a branch, tag or commit name"):
            open_reader("org/tiny", revision=rev)


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "big"])
def test_hub_ref_that_is_not_a_small_regular_file(tmp_path, monkeypatch, limit, kind):
    from ..fuzz.harness import check_outcome, run_cli

    root = _cache(tmp_path, monkeypatch)
    ref = root / "refs" / "main"
    if kind == "fifo":
        os.mkfifo(ref)
    elif kind == "dev_zero":
        ref.symlink_to("/dev/zero")
    else:
        ref.write_text("a" * 5000)
    with pytest.raises(HeadRankError, match=r"refs/main (is not a regular file|is larger than)"):
        open_reader("org/tiny")
    code, _, err = run_cli("spectra", "org/tiny")
    check_outcome(code, err)
    assert code == 2


def test_snapshot_resolving_outside_the_cache(tmp_path, monkeypatch):
    root = _cache(tmp_path, monkeypatch, "b" * 40)
    outside = write_tiny(tmp_path / "elsewhere")
    (root / "snapshots" / ("b" * 40)).symlink_to(outside)
    with pytest.raises(HeadRankError, match="outside its cache folder"):
        open_reader("org/tiny")


def _train_run(tmp_path, *extra):
    from ..fuzz.harness import run_cli

    run = tmp_path / "run"
    code, _, err = run_cli("train", "lm", "--out", str(run), "--steps", "2", "--checkpoint-every", "2",
                           "--n-layers", "1", "--d-model", "16", "--max-chars", "4000", "--quiet", "--log",
                           "none", *extra)
    assert code == 0, err
    return run


@pytest.mark.slow
@pytest.mark.parametrize("what", ["run_config", "model_tokenizer", "run_tokenizer"])
def test_fifos_in_run_and_model_directories_do_not_hang(tmp_path, limit, what):
    """collapse RUN with a FIFO as the run's config.json, the checkpoint's tokenizer.json, or
    `train lm --tokenizer bpe --resume` with a FIFO as RUN/tokenizer.json: one line, no hang."""
    from ..fuzz.harness import check_outcome, run_cli

    run = _train_run(tmp_path, "--tokenizer", "bpe", "--bpe-vocab", "300")
    ck = sorted((run / "checkpoints").iterdir())[-1]
    target = {"run_config": run / "config.json", "model_tokenizer": ck / "tokenizer.json",
              "run_tokenizer": run / "tokenizer.json"}[what]
    target.unlink(missing_ok=True)
    os.mkfifo(target)
    if what == "run_tokenizer":
        code, _, err = run_cli("train", "lm", "--out", str(run), "--steps", "4", "--checkpoint-every", "2",
                               "--n-layers", "1", "--d-model", "16", "--max-chars", "4000", "--quiet", "--log",
                               "none", "--tokenizer", "bpe", "--bpe-vocab", "300", "--resume")
    else:
        code, _, err = run_cli("collapse", str(run), "--seqs", "2", "--max-tokens", "8", "--quiet")
    check_outcome(code, err)
    assert code == 2 and "is not a regular file (a FIFO)" in err, err
