"""Fuzzing every input a user or a file supplies: the CLI keeps its promise.

Generated config.json dicts, safetensors headers, shard indexes, TOML layouts, layer specs and
option values go through the real entry point (in process, see :mod:`.harness`). Whatever they
are: exit 0, or exit 2 with exactly one stderr line; never a traceback, never a hang, never a
half-written or mixed output set. ``make test`` tries a few derandomized examples per test;
``make fuzz`` many random ones.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from .harness import (
    ROLES,
    TINY_CONFIG,
    check_outcome,
    raw_safetensors,
    run_cli,
    snapshot,
    tiny_tensors,
    write_tiny,
)

pytestmark = pytest.mark.filterwarnings("ignore")

SIZE_KEYS = ("hidden_size", "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "head_dim")
MODEL_TYPES = ("bert", "llama", "gpt2", "falcon", "headrank", "mamba", "", "[/]", "b[red]x", "gpt_neox")
weird_scalars = st.one_of(
    st.integers(min_value=-3, max_value=40),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([True, False, None, 8.9, 8.0, 1e30, 1e9, 0, -1, 2**63, "8", "", "[/]"]),
    st.text(max_size=6),
)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=5)),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=10)


def _spectra(src: Path, *extra: str) -> tuple[int, str, str]:
    return run_cli("spectra", str(src), "--json", "--no-plots", *extra)


@given(changes=st.dictionaries(st.sampled_from(SIZE_KEYS + ("model_type", "multi_query", "new_decoder_architecture")),
                               weird_scalars | st.sampled_from(MODEL_TYPES), max_size=4),
       extra=st.dictionaries(st.text(max_size=8), json_values, max_size=2))
def test_fuzz_config_values(changes, extra):
    """config.json with generated values for the sizes (bools, floats, Infinity, huge, negative,
    strings) and the model_type."""
    with tempfile.TemporaryDirectory() as t:
        cfg = {**TINY_CONFIG, **extra, **changes}
        src = write_tiny(Path(t) / "m", cfg)
        code, out, err = _spectra(src)
        check_outcome(code, err)
        if code == 0:  # accepted sizes are the true ones: an integer, not a bool or a truncated float
            for k in ("hidden_size", "num_attention_heads"):
                v = cfg.get(k)
                assert isinstance(v, int) and not isinstance(v, bool) or (
                    isinstance(v, float) and math.isfinite(v) and v == int(v)), (k, v)


@given(cfg=json_values | st.sampled_from(["[" * 100_000, '{"a":' * 50_000, "", "\x00", "\ufeff{}", "nul\x00"]))
def test_fuzz_config_whole(cfg):
    """A config.json that is any JSON value, or not JSON at all (deep nesting included)."""
    with tempfile.TemporaryDirectory() as t:
        src = write_tiny(Path(t) / "m")
        (src / "config.json").write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
        check_outcome(*_spectra(src)[::2])


DTYPES = ("F32", "F16", "BF16", "F64", "C64", "I8", "I64", "BOOL", "U8", "F8_E4M3", "XX", "")
entry = st.fixed_dictionaries(
    {"dtype": st.sampled_from(DTYPES) | st.text(max_size=4),
     "shape": st.lists(st.integers(min_value=-2, max_value=2**40) | st.sampled_from([8, 4, 0]), max_size=3),
     "data_offsets": st.lists(st.integers(min_value=-2, max_value=2**40) | st.sampled_from([0, 256, 512]),
                              min_size=0, max_size=3)})
NAMES = sorted(tiny_tensors())


@given(header=st.dictionaries(st.sampled_from(NAMES) | st.text(max_size=6), entry | json_values, max_size=6),
       metadata=st.none() | json_values,
       data_len=st.integers(min_value=0, max_value=4096),
       length=st.none() | st.integers(min_value=0, max_value=2**64 - 1))
def test_fuzz_safetensors_header(header, metadata, data_len, length):
    """model.safetensors with a generated header: dtypes (complex, bool, unknown), shapes,
    offsets out of range, a stated header length that lies."""
    with tempfile.TemporaryDirectory() as t:
        src = write_tiny(Path(t) / "m")
        if metadata is not None:
            header = {**header, "__metadata__": metadata}
        (src / "model.safetensors").write_bytes(raw_safetensors(header, b"\0" * data_len, length))
        check_outcome(*_spectra(src)[::2])


shard_names = st.sampled_from(["model-1.safetensors", "model-2.safetensors", "../model-1.safetensors",
                               "/etc/passwd", "sub/../model-1.safetensors", "missing.safetensors", "", ".",
                               "config.json", "a/../../b.safetensors"]) | st.text(max_size=8)


@given(weight_map=st.dictionaries(st.sampled_from(NAMES) | st.text(max_size=5), shard_names, max_size=10)
       | json_values,
       wrap=st.booleans())
def test_fuzz_shard_index(weight_map, wrap):
    """model.safetensors.index.json with a generated weight_map (a list, a string, paths that
    leave the checkpoint, missing shards)."""
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory() as t:
        root = Path(t)
        src = root / "m"
        src.mkdir()
        (src / "config.json").write_text(json.dumps(TINY_CONFIG))
        tensors = tiny_tensors()
        half = len(NAMES) // 2
        save_file({k: tensors[k] for k in NAMES[:half]}, src / "model-1.safetensors")
        save_file({k: tensors[k] for k in NAMES[half:]}, src / "model-2.safetensors")
        save_file(tensors, root / "model-1.safetensors")  # outside: must never be read
        (src / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map} if wrap
                                                                     else weight_map))
        code, out, err = _spectra(src)
        check_outcome(code, err)
        if code == 0:
            assert all(isinstance(v, str) and ".." not in Path(v).parts and not v.startswith("/")
                       for v in weight_map.values())


SPLITS = ("separate", "fused", "conv1d_fused", "fused_per_head", "fused_per_kv_group", "interleaved", "grouped")
PATTERNS = ["encoder.layer.{i}.attention.self.query.weight", "x.{x}", "x.{i.__class__}", "x.{i!r}", "x.{i:>3}",
            "x.{}", "x.{0}", "x.{{i}}", "x{", "x}", "x.{i[0]}", "{i}", ""]
toml_scalar = st.one_of(st.integers(min_value=-(2**63), max_value=2**63 - 1), st.floats(allow_nan=True),
                        st.booleans(), st.text(max_size=6), st.sampled_from(PATTERNS))
toml_value = toml_scalar | st.lists(toml_scalar, max_size=2)


def _toml(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if v != v else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return json.dumps(v)  # a TOML basic string


def _toml_doc(top: dict, tables: dict) -> str:
    lines = [f"{json.dumps(k)} = {_toml(v)}" for k, v in top.items()]
    for name, table in tables.items():
        lines.append(f"[{name}]")
        lines += [f"{json.dumps(k)} = {_toml(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


_GOOD_TENSORS = {r: f"encoder.layer.{{i}}.attention.{n}.weight" for r, n in ROLES.items()}
_GOOD_SIZES = {"n_layers": 2, "d_model": 8, "n_heads": 2}


@given(split=st.sampled_from(SPLITS) | toml_value,
       tensors=st.dictionaries(st.sampled_from(["q", "k", "v", "o", "qkv", "x"]), toml_value, max_size=4),
       keep_good=st.booleans(),
       sizes=st.dictionaries(st.sampled_from(["n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "x"]),
                             toml_value, max_size=3),
       norm=st.none() | st.dictionaries(st.sampled_from(["name", "kind", "offset"]), toml_value, max_size=3),
       extra=st.dictionaries(st.sampled_from(["position", "qk_norm", "oops"]), toml_value, max_size=2),
       garbage=st.none() | st.text(max_size=30))
def test_fuzz_toml_layout(split, tensors, keep_good, sizes, norm, extra, garbage):
    """--layout files: generated split, tensor patterns ({x}, {i.__class__}, format specs),
    sizes, norm table, unknown keys, or text that is not TOML."""
    with tempfile.TemporaryDirectory() as t:
        src = write_tiny(Path(t) / "m")
        tables = {"tensors": {**(_GOOD_TENSORS if keep_good else {}), **tensors},
                  "sizes": {**(_GOOD_SIZES if keep_good else {}), **sizes}}
        if norm is not None:
            tables["norm"] = norm
        doc = garbage if garbage is not None else _toml_doc({"split": split, **extra}, tables)
        layout = Path(t) / "l.toml"
        layout.write_text(doc)
        code, out, err = _spectra(src / "model.safetensors", "--layout", str(layout))
        check_outcome(code, err)


@given(spec=st.text(alphabet="0123456789-,e+ .x", max_size=12)
       | st.builds(lambda a, b: f"{a}-{b}", st.integers(-3, 2**70), st.integers(-3, 2**70)))
def test_fuzz_layer_specs(spec):
    """--layers: ranges reversed, huge, negative, empty, malformed."""
    with tempfile.TemporaryDirectory() as t:
        src = write_tiny(Path(t) / "m")
        code, out, err = _spectra(src, "--layers", spec)
        check_outcome(code, err)
        if code == 0:
            assert {r["layer"] for r in json.loads(out)["layers"]} <= {0, 1}


option_text = st.text(max_size=8) | st.sampled_from(["nan", "inf", "-1", "0", "1e23", "1e-300", "0.5", "[/]", "--"])


@given(tol=st.none() | option_text, fmt=st.none() | st.sampled_from(["table", "csv", "json", "xml", "[red]"]),
       threads=st.none() | option_text | st.integers(-2, 2**40).map(str),
       out_kind=st.sampled_from(["none", "fresh", "existing", "file", "under_file", "brackets"]),
       unknown=st.booleans())
def test_fuzz_spectra_options(tol, fmt, threads, out_kind, unknown):
    """spectra's option values (tolerance, format, threads, --out on a file or beneath one, names
    with brackets, unknown options): one line, and --out keeps a whole set or its old one."""
    with tempfile.TemporaryDirectory() as t:
        root = Path(t)
        src = write_tiny(root / "m")
        args = ["spectra", str(src), "--no-plots", "--quiet"]
        for name, v in (("--tol", tol), ("--format", fmt), ("--threads", threads)):
            if v is not None:
                args += [name, v]
        out_dir = None
        if out_kind != "none":
            out_dir = {"fresh": root / "o", "existing": root / "o", "file": root / "f", "under_file": root / "f" / "o",
                       "brackets": root / "o[red]x[/]"}[out_kind]
            if out_kind == "existing":
                out_dir.mkdir()
                (out_dir / "heads.csv").write_text("previous\n")
                (out_dir / "meta.json").write_text("{}\n")
            if out_kind in ("file", "under_file"):
                (root / "f").write_text("a file\n")
            args += ["--out", str(out_dir)]
        if unknown:
            args += ["--no-such-option"]
        before = snapshot(out_dir) if out_dir is not None and out_dir.is_dir() else None
        code, out, err = run_cli(*args)
        check_outcome(code, err, out_dir if out_dir is not None and out_dir.is_dir() else None, before)
        if code == 0 and out_dir is not None:
            assert {"heads.csv", "summary.csv", "spectra.npz", "meta.json"} <= {p.name for p in out_dir.iterdir()}
            assert json.loads((out_dir / "meta.json").read_text())["source"] == str(src)
