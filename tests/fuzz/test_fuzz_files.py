"""Fuzzing the files a red team can hand over (issue 27): GGUF metadata, ``.bin`` pickles of
tensors, LoRA adapter configs, training run directories (config.json, state.pt), sweep specs and
Hugging Face cache refs.

The property is the one of :mod:`.test_fuzz_inputs`: through the real entry point, exit 0 or
exit 2 with exactly one stderr line, never a traceback or a hang (library-level tests: an
:class:`~headrank.errors.HeadRankError` or a result, never another exception). ``make test``
tries a few derandomized examples per test; ``make fuzz`` many random ones.
"""

from __future__ import annotations

import functools
import json
import os
import struct
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from headrank.errors import HeadRankError

from .harness import TINY_CONFIG, check_outcome, run_cli, tiny_tensors, write_tiny
from .test_fuzz_inputs import json_values, weird_scalars

pytestmark = pytest.mark.filterwarnings("ignore")


def few(n: int) -> int:
    """``n`` examples for a slow test in ``make test``; what ``make fuzz`` asks for otherwise."""
    return int(os.environ.get("HEADRANK_FUZZ_EXAMPLES", n))


# -- GGUF metadata ----------------------------------------------------------------------------------
def _gguf_str(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


@functools.lru_cache(maxsize=1)
def valid_gguf() -> bytes:
    """A real one-layer qwen2-shaped GGUF (d = 8, 2 heads), written by the gguf package."""
    import gguf
    import numpy as np

    with tempfile.TemporaryDirectory() as t:
        f = Path(t) / "m.gguf"
        w = gguf.GGUFWriter(str(f), "qwen2")
        for add, v in ((w.add_block_count, 1), (w.add_embedding_length, 8), (w.add_head_count, 2),
                       (w.add_head_count_kv, 2), (w.add_key_length, 4), (w.add_value_length, 4)):
            add(v)
        w.add_string("general.name", "tiny")
        rng = np.random.default_rng(0)
        for n in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(f"blk.0.{n}.weight", rng.standard_normal((8, 8)).astype(np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return f.read_bytes()


kv_entry = st.tuples(
    st.sampled_from([b"general.architecture", b"general.name", b"llama.block_count", b"llama.embedding_length",
                     b"llama.attention.head_count", b"x"]) | st.binary(max_size=6),
    st.integers(0, 13),  # value types, 13 unknown
    st.sampled_from([0, 1, 2, 5, 10**8, 2**32 - 1, 2**62, 2**64 - 1]) | st.integers(0, 40),  # counts/lengths
    st.binary(max_size=24))


@given(entries=st.lists(kv_entry, max_size=4), n_kv=st.none() | st.sampled_from([0, 2**40, 2**64 - 1]),
       n_tensors=st.sampled_from([0, 1, 2**50]), version=st.sampled_from([3, 2, 1, 3 << 24]))
@settings(max_examples=few(15))
def test_fuzz_gguf_metadata(entries, n_kv, n_tensors, version):
    """Hand-built metadata: any value type, array counts and string lengths up to 2^64 - 1,
    non-UTF-8 keys and names, counts that do not match the entries."""
    body = b""
    for key, vtype, count, payload in entries:
        body += _gguf_str(key) + struct.pack("<I", vtype)
        if vtype == 8:  # string: a length, then (maybe fewer) bytes
            body += struct.pack("<Q", count) + payload
        elif vtype == 9:  # array: element type, count, payload
            body += struct.pack("<IQ", payload[0] % 14 if payload else 4, count) + payload[1:]
        else:
            body += payload
    data = b"GGUF" + struct.pack("<IQQ", version, n_tensors, len(entries) if n_kv is None else n_kv) + body
    with tempfile.TemporaryDirectory() as t:
        f = Path(t) / "m.gguf"
        f.write_bytes(data)
        check_outcome(*run_cli("spectra", str(f), "--json", "--no-plots")[::2])


@given(cut=st.integers(0, 10_000), patches=st.lists(st.tuples(st.integers(0, 400), st.binary(min_size=1, max_size=8)),
                                                     max_size=3))
@settings(max_examples=few(15))
def test_fuzz_gguf_mutated(cut, patches):
    """A real GGUF file overwritten at a few places in its header and metadata, and/or cut short."""
    data = bytearray(valid_gguf())
    for at, b in patches:
        data[at:at + len(b)] = b
    data = bytes(data[: len(data) - cut if cut < len(data) else len(data)])
    with tempfile.TemporaryDirectory() as t:
        f = Path(t) / "m.gguf"
        f.write_bytes(data)
        check_outcome(*run_cli("spectra", str(f), "--json", "--no-plots")[::2])


# -- .bin pickles of tensors ------------------------------------------------------------------------
def _odd_tensor(kind: str, shape: tuple[int, ...]) -> object:
    base = torch.randn(8, 8)
    return {
        "dense": lambda: base,
        "shape": lambda: torch.randn(shape),
        "0d": lambda: torch.tensor(1.5),
        "int": lambda: base.to(torch.int64),
        "bool": lambda: base > 0,
        "complex": lambda: base.to(torch.complex64),
        "half": lambda: base.half(),
        "sparse": lambda: base.to_sparse(),
        "csr": lambda: base.to_sparse_csr(),
        "qint8": lambda: torch.quantize_per_tensor(base, 0.1, 0, torch.qint8),
        "meta": lambda: torch.empty(8, 8, device="meta"),
        "nan": lambda: torch.full((8, 8), float("nan")),
        "view": lambda: torch.randn(16, 16)[::2, ::2],
        "int_value": lambda: 5,
        "str_value": lambda: "abc",
        "nested": lambda: {"a": base},
        "list": lambda: [base],
    }[kind]()


TENSOR_KINDS = ("dense", "shape", "0d", "int", "bool", "complex", "half", "sparse", "csr", "qint8", "meta", "nan",
                "view", "int_value", "str_value", "nested", "list")


@given(kinds=st.dictionaries(st.integers(0, 7), st.sampled_from(TENSOR_KINDS), max_size=3),
       shape=st.lists(st.integers(0, 9), max_size=3).map(tuple), wrap=st.sampled_from(["flat", "state_dict", "list"]))
@settings(max_examples=few(12))
def test_fuzz_bin_pickles(kinds, shape, wrap):
    """``pytorch_model.bin`` holding dense, sparse, quantized, meta, complex, bool, 0-d and
    mis-shaped tensors, or values that are not tensors at all."""
    t = tiny_tensors()
    names = list(t)
    for i, kind in kinds.items():
        t[names[i]] = _odd_tensor(kind, shape)
    obj = {"flat": t, "state_dict": {"state_dict": t}, "list": list(t.values())}[wrap]
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "m"
        src.mkdir()
        torch.save(obj, src / "pytorch_model.bin")
        (src / "config.json").write_text(json.dumps(TINY_CONFIG))
        check_outcome(*run_cli("spectra", str(src), "--json", "--no-plots")[::2])


# -- LoRA adapter configs ---------------------------------------------------------------------------
ADAPTER_KEYS = ("peft_type", "r", "lora_alpha", "use_rslora", "use_dora", "fan_in_fan_out", "alpha_pattern",
                "base_model_name_or_path", "target_modules")


@given(cfg=st.dictionaries(st.sampled_from(ADAPTER_KEYS), weird_scalars | json_values, max_size=5),
       a_shape=st.lists(st.integers(0, 9), max_size=3).map(tuple), b_shape=st.lists(st.integers(0, 9), max_size=3).map(tuple),
       whole=st.none() | json_values)
@settings(max_examples=few(10))
def test_fuzz_adapter_config(cfg, a_shape, b_shape, whole):
    """adapter_config.json with generated values (or any JSON at all), on LoRA A/B matrices of
    generated shapes (0-d included)."""
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory() as d:
        base = write_tiny(Path(d) / "base")
        ad = Path(d) / "lora"
        ad.mkdir()
        config = {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "base_model_name_or_path": str(base), **cfg}
        (ad / "adapter_config.json").write_text(json.dumps(config if whole is None else whole))
        pre = "base_model.model.encoder.layer.0.attention.self.query"
        save_file({f"{pre}.lora_A.weight": torch.randn(a_shape), f"{pre}.lora_B.weight": torch.randn(b_shape)},
                  ad / "adapter_model.safetensors")
        check_outcome(*run_cli("spectra", str(ad), "--json", "--no-plots")[::2])


# -- training run directories -----------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _run_template() -> Path:
    """A finished 4-step recall run with checkpoints at steps 2 and 4 (made once per session)."""
    root = Path(tempfile.mkdtemp(prefix="headrank-fuzz-run-"))
    code, _, err = run_cli("train", "recall", "--out", str(root / "r"), "--steps", "4", "--checkpoint-every", "2",
                           "--quiet", "--log", "none")
    assert code == 0, err
    return root / "r"


STATE_KEYS = ("step", "metrics_bytes", "optimizer", "torch_rng", "cuda_rng", "stream", "window_loss", "window_acc",
              "window_n")
state_values = st.one_of(st.integers(-3, 10**12), st.sampled_from([True, None, "4", 2.5, [], {}, {"state": 5}]),
                         st.builds(lambda n: torch.zeros(n, dtype=torch.uint8), st.integers(0, 8)))


@given(changes=st.dictionaries(st.sampled_from(STATE_KEYS), state_values, max_size=3),
       drop=st.lists(st.sampled_from(STATE_KEYS), max_size=2),
       config=st.none() | st.dictionaries(st.sampled_from(["kind", "task_name", "steps", "model", "task", "seed"]),
                                          weird_scalars | json_values, max_size=3))
@settings(max_examples=few(6))
def test_fuzz_run_directory(changes, drop, config):
    """A run whose newest state.pt has generated, missing or wrongly typed parts, and whose
    config.json has generated values; resumed with `train recall --resume` and read by `spectra`."""
    import shutil

    with tempfile.TemporaryDirectory() as d:
        run = Path(d) / "r"
        shutil.copytree(_run_template(), run)
        ck = sorted((run / "checkpoints").iterdir())[-1]
        state = torch.load(ck / "state.pt", weights_only=True)
        state.update(changes)
        for k in drop:
            state.pop(k, None)
        torch.save(state, ck / "state.pt")
        if config is not None:
            cfg = json.loads((run / "config.json").read_text())
            (run / "config.json").write_text(json.dumps({**cfg, **config}))
        code, _, err = run_cli("train", "recall", "--out", str(run), "--steps", "4", "--checkpoint-every", "2",
                               "--resume", "--quiet", "--log", "none")
        check_outcome(code, err)
        check_outcome(*run_cli("spectra", str(run), "--json", "--no-plots")[::2])


# -- sweep specs ------------------------------------------------------------------------------------
spec_values = weird_scalars | json_values | st.sampled_from(["recall", "lm", "vit", ["recall"], {"a": 1}])


def toml_value(v: object) -> str:
    """``v`` as a TOML value (inline tables and arrays); ValueError for what TOML cannot hold."""
    import math

    if v is None:
        raise ValueError("TOML has no null")
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if v != v else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(x)}" for k, x in dict(v).items()) + "}"


@given(spec=st.dictionaries(st.sampled_from(["kind", "base", "grid", "seeds", "extra"]), spec_values, max_size=4),
       base=st.dictionaries(st.sampled_from(["steps", "lr", "model", "task", "attn_weight_decay", "x"]), spec_values,
                            max_size=2),
       grid=st.dictionaries(st.sampled_from(["attn_weight_decay", "weight_decay", "model", "seed"]),
                            st.lists(spec_values, max_size=3) | spec_values, max_size=2),
       toml=st.booleans())
def test_fuzz_sweep_spec(spec, base, grid, toml):
    """A sweep spec file (JSON or TOML) of generated kinds, bases, grids and seeds: loading it and
    building every run's config is an HeadRankError or works (nothing is trained here)."""
    from headrank.training.config import make_config
    from headrank.training.sweep import load_spec

    d = {"kind": "recall", **({"base": base} if base else {}), **({"grid": grid} if grid else {}), **spec}
    with tempfile.TemporaryDirectory() as t:
        f = Path(t) / ("s.toml" if toml else "s.json")
        if toml:
            try:
                f.write_text("\n".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in d.items()) + "\n")
            except ValueError:
                return  # not representable in TOML (null)
        else:
            f.write_text(json.dumps(d))
        try:
            s = load_spec(f)
            for _, overrides in s.runs()[:4]:
                make_config(s.kind, **overrides)
        except HeadRankError as e:
            assert "\n" not in str(e).strip()


# -- Hugging Face cache refs ------------------------------------------------------------------------
@given(ref=st.binary(max_size=60) | st.sampled_from([b"a" * 40, b"b" * 40, b"../../../outside", b"a" * 40 + b"\n",
                                                      b"/etc/passwd", b"\xff" * 40]),
       kind=st.sampled_from(["file", "fifo", "dev_zero", "dir", "missing"]),
       revision=st.none() | st.sampled_from(["main", "v1", "../main", "a" * 40, "refs/pr/1", "", "/etc"])
       | st.text(max_size=8))
def test_fuzz_hub_refs(ref, kind, revision):
    """A cached Hub id whose refs/REVISION holds anything (a path out of the cache, binary, a
    newline) or is a FIFO, /dev/zero, a directory or missing: a reader of a snapshot inside the
    cache, or one HeadRankError; never a hang, never a model from outside the cache."""
    import re

    from headrank.io.sources import open_reader

    from .harness import time_limit

    old = {k: os.environ.get(k) for k in ("HF_HUB_CACHE", "HF_HUB_OFFLINE")}
    with tempfile.TemporaryDirectory() as t:
        cache = Path(t) / "hub"
        root = cache / "models--org--tiny"
        write_tiny(root / "snapshots" / ("a" * 40))
        write_tiny(Path(t) / "outside")
        refs = root / "refs"
        refs.mkdir(parents=True)
        simple = revision is not None and re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9._-]*", revision)
        target = refs / (revision if simple else "main")
        if kind == "file":
            target.write_bytes(ref)
        elif kind == "fifo":
            os.mkfifo(target)
        elif kind == "dev_zero":
            target.symlink_to("/dev/zero")
        elif kind == "dir":
            target.mkdir()
        os.environ.update(HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1")
        try:
            with time_limit():
                reader = open_reader("org/tiny", revision=revision)
            assert reader.ckpt.path.resolve().is_relative_to(root.resolve())
        except HeadRankError as e:
            assert "\n" not in str(e).strip()
        finally:
            for k, v in old.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
