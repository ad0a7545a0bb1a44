"""One validation layer for what a file or a caller supplies: numbers, files, patterns, sizes.

Every check here raises :class:`~headrank.errors.HeadRankError` with one line that names the
file (or option) and the value, so the CLI prints one line and exits 2:

- :func:`as_int` / :func:`as_float`: a config value of the right type, finite, in range
  (``true`` is not 1, ``8.9`` is not 8, ``Infinity`` and ``1e30`` are refused);
- :func:`regular_file`, :func:`read_bytes`, :func:`read_json`: only regular files are opened
  (a FIFO or a device named ``config.json`` would block or never end), permission errors name
  the path, deeply nested JSON is one line rather than a ``RecursionError``;
- :func:`tensor_pattern`: a layout's tensor name may use only the field ``{i}`` (no
  ``{i.__class__}``, no ``{x}``, no format spec);
- :func:`check_fits`: sizes whose product this machine cannot hold are refused before
  anything is allocated.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import string
from numbers import Integral, Real
from pathlib import Path
from typing import Any

from headrank.errors import HeadRankError, one_line

# Bounds on sizes a config may state (far above any released model; they keep products of
# sizes well inside 64-bit integers and loops over layers finite).
MAX_LAYERS = 100_000
MAX_WIDTH = 1 << 22  # d_model
MAX_HEADS = 1 << 16
MAX_HEAD_DIM = 1 << 16
MAX_VOCAB = 1 << 22  # 4M entries (the largest released vocabularies: ~260k)
MAX_FFN = 1 << 22
MAX_POSITIONS = 1 << 24
MAX_INDEX = 1 << 40  # an index or offset read from a record (a tensor dimension, a byte offset)
#: the one table of bounds on a number read from a config, an index or a record, by kind: every
#: reader checks a number against it (:func:`bounded`) before anything is allocated from it
BOUNDS = {"layers": MAX_LAYERS, "width": MAX_WIDTH, "heads": MAX_HEADS, "head_dim": MAX_HEAD_DIM,
          "vocab": MAX_VOCAB, "ffn": MAX_FFN, "positions": MAX_POSITIONS, "index": MAX_INDEX,
          "count": 1 << 20, "checkpoints": 1000}
MAX_JSON_BYTES = 256 << 20  # a JSON file of a kind without its own cap (JSON_CAPS) larger than this is not one
# byte caps per kind of JSON, far above the largest seen on the Hub (configs: tens of KB, a few MB with
# 20k labels; shard indexes: under 10 MB for 90k tensors; safetensors headers: a few MB; refs: KB)
JSON_CAPS = {"config": 16 << 20, "shard index": 64 << 20, "safetensors header": 64 << 20,
             "list of refs": 16 << 20, "adapter config": 16 << 20,
             # records this project writes and reads back (a planted one may be anything): far above
             # the largest written (a factored manifest of a 405B model: ~20 MB of runs)
             "factored manifest": 64 << 20, "compress record": 16 << 20, "run record": 16 << 20,
             "layout cache": 64 << 20, "layout file": 1 << 20, "track record": 16 << 20,
             "sweep spec": 1 << 20, "run config": 16 << 20}
JSON_BUDGET = 1 << 30  # at most this much memory for one parse (also at most half of what is free)


def as_int(value: Any, name: str, where: str, *, lo: int = 1, hi: int | None = None) -> int:
    """``value`` as an int in ``[lo, hi]``: ints, and floats with an integral value (``8.0``);
    never a bool, a non-integral float, a non-finite number or a string."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise HeadRankError(f"{_at(where)}{name} must be an integer; got {_show(value)}")
    if not isinstance(value, Integral):
        if not math.isfinite(float(value)) or float(value) != math.floor(float(value)):
            raise HeadRankError(f"{_at(where)}{name} must be an integer; got {_show(value)}")
    if value < lo or (hi is not None and value > hi):
        rng = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise HeadRankError(f"{_at(where)}{name} must lie in {rng}; got {_show(value)}")
    return int(value)


def as_float(value: Any, name: str, where: str, *, lo: float | None = None, hi: float | None = None,
             lo_open: bool = False) -> float:
    """``value`` as a finite float in the range (``lo_open``: ``lo`` itself excluded); not a bool
    or a string."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
        raise HeadRankError(f"{_at(where)}{name} must be a finite number; got {_show(value)}")
    v = float(value)
    if (lo is not None and (v < lo or (lo_open and v == lo))) or (hi is not None and v > hi):
        lo_s = "" if lo is None else f"{'>' if lo_open else '>='} {lo:g}"
        hi_s = "" if hi is None else f"<= {hi:g}"
        raise HeadRankError(f"{_at(where)}{name} must be {' and '.join(s for s in (lo_s, hi_s) if s)}; "
                            f"got {_show(value)}")
    return v


def bounded(value: Any, kind: str, name: str, where: str, *, lo: int = 1) -> int:
    """``value`` as an int within the bound of its ``kind`` (:data:`BOUNDS`): the one check of
    a size, count or index read from a file before anything is allocated from it."""
    return as_int(value, name, where, lo=lo, hi=BOUNDS[kind])


#: config.json fields that size what a model allocates, by kind of bound
CONFIG_SIZES = {
    "layers": ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "num_decoder_layers", "encoder_layers",
               "decoder_layers"),
    "width": ("hidden_size", "n_embd", "d_model", "dim"),
    "heads": ("num_attention_heads", "n_head", "n_heads", "num_key_value_heads", "num_heads",
              "encoder_attention_heads", "decoder_attention_heads"),
    "head_dim": ("head_dim",),
    "vocab": ("vocab_size",),
    "ffn": ("intermediate_size", "n_inner", "ffn_dim", "d_ff", "hidden_dim", "encoder_ffn_dim", "decoder_ffn_dim"),
    "positions": ("max_position_embeddings", "n_positions"),
}
_SUBCONFIG_DEPTH = 3


def check_config_sizes(cfg: Any, where: Any, *, dtype_bytes: int = 4, copies: int = 1) -> int:
    """Bound every size field of a config dict (and its sub-configs: ``text_config``, ...) by
    :data:`BOUNDS`, then refuse a model whose parameters (a lower bound: one embedding, W_Q and
    W_O and two MLP matrices per layer, so that no model that fits is refused) in
    ``dtype_bytes`` per number, ``copies`` times, exceed this machine's memory: before a model is
    built from it (a ``to_empty`` of a 2³¹ vocabulary, a meta-device build of a million layers;
    the exact count follows once the model is on the meta device). Returns the lower bound."""
    if not isinstance(cfg, dict):
        raise HeadRankError(f"{where}: a config must be a JSON object; got {_show(cfg)}")
    n = _config_params(cfg, str(where), 0)
    check_fits(n * dtype_bytes * copies, f"{where}: a model of at least {n:,} parameters")
    return n


def _config_params(cfg: dict[str, Any], where: str, depth: int) -> int:
    got: dict[str, int] = {}
    for kind, keys in CONFIG_SIZES.items():
        for k in keys:
            v = cfg.get(k)
            if v is None:
                continue
            vals = v if isinstance(v, list) else [v]
            if len(vals) > BOUNDS["layers"]:
                raise HeadRankError(f"{where}: {k} lists {len(vals):,} values, more than {BOUNDS['layers']:,}")
            lo = 0 if kind in ("ffn", "positions", "head_dim") else 1
            got[kind] = max([got.get(kind, 0)] + [bounded(x, kind, k, where, lo=lo) for x in vals])
    n = 0
    if depth < _SUBCONFIG_DEPTH:
        n = sum(_config_params(v, f"{where} {k}", depth + 1) for k, v in cfg.items() if isinstance(v, dict)
                and k.endswith("config"))
    d = got.get("width", 0)
    layer = 2 * d * d + 2 * d * got.get("ffn", 0)  # at least W_Q and W_O, and an MLP's two matrices
    return n + got.get("layers", 0) * layer + got.get("vocab", 0) * d  # and one embedding


def _at(where: Any) -> str:
    """The prefix naming where a value was read (nothing for an empty ``where``: no ": : field")."""
    return f"{where}: " if str(where) else ""


def _show(value: Any) -> str:
    s = repr(value)
    return s if len(s) <= 60 else s[:57] + "..."


# -- files -----------------------------------------------------------------------------------
def os_error(e: OSError, path: str | os.PathLike, doing: str = "read") -> HeadRankError:
    """One line for an OSError on ``path`` (permission denied, no space left, ...)."""
    if isinstance(e, PermissionError) or e.errno in (errno.EACCES, errno.EPERM):
        return HeadRankError(f"permission denied: cannot {doing} {path}")
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return HeadRankError(f"no space left on the device: cannot {doing} {path}")
    if e.errno == errno.ENOENT:
        return HeadRankError(f"no such file or directory: {path}")
    reason = e.strerror or one_line(e, 200)
    return HeadRankError(f"cannot {doing} {path}: {reason}")


def regular_file(path: str | os.PathLike, what: str = "file") -> Path:
    """``path`` if it is a regular file (symlinks followed); else one line: missing, not a
    regular file (a FIFO, socket or device would block or never end), or not permitted."""
    p = Path(path)
    try:
        st = os.stat(p)
    except OSError as e:
        raise os_error(e, p, f"read the {what}") from None
    if stat.S_ISDIR(st.st_mode):
        raise HeadRankError(f"{p} is a directory, not a {what}")
    if not stat.S_ISREG(st.st_mode):
        raise HeadRankError(f"{p} is not a regular file ({_kind(st.st_mode)}): refusing to read it as a {what}")
    real = os.path.realpath(p)
    if any(real == top or real.startswith(top + os.sep) for top in PSEUDO_FS):
        raise HeadRankError(f"{p} is a file of the kernel's {real.split(os.sep)[1]} file system ({real}), whose "
                            f"size says nothing of what it yields: refusing to read it as a {what}")
    return p


PSEUDO_FS = ("/proc", "/sys")  # "regular" files there (/proc/self/pagemap) never end or lie about their size


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a plain file"


def is_regular_file(path: str | os.PathLike) -> bool:
    """True for a regular file (symlinks followed); False for anything else or on any error."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def check_readable(path: str | os.PathLike, what: str = "file") -> Path:
    """:func:`regular_file`, and the file can be opened for reading (permission checked now)."""
    p = regular_file(path, what)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise os_error(e, p, f"read the {what}") from None
    os.close(fd)
    return p


def read_bytes(path: str | os.PathLike, what: str = "file", max_bytes: int | None = None) -> bytes:
    """The contents of a regular file of at most ``max_bytes`` (default the cap of its kind,
    :data:`JSON_CAPS`, else :data:`MAX_JSON_BYTES`); one line for anything else.

    The one way a planted file is read: it is opened without blocking (``O_NONBLOCK``: a FIFO put
    where a record was expected cannot hang the open) and checked on the open descriptor
    (``fstat``: a regular file, not a FIFO, device or directory, and no larger than the cap), so
    nothing swapped in between the check and the read is read; at most ``max_bytes + 1`` bytes
    are ever read (a file growing meanwhile is refused, not followed)."""
    from headrank.util.fileio import read_regular

    cap = JSON_CAPS.get(what, MAX_JSON_BYTES) if max_bytes is None else max_bytes
    p = regular_file(path, what)
    try:
        return read_regular(p, what, cap)
    except OSError as e:
        raise os_error(e, p, f"read the {what}") from None


def file_identity(path: str | os.PathLike) -> tuple[int, int, int, int]:
    """What identifies a file's contents cheaply: device, inode, size and modification time (ns).
    A file truncated, rewritten or replaced by rename between two calls gives two identities."""
    from headrank.io.identity import stamp_of  # the identity a reader records (io.identity)

    return stamp_of(os.stat(path))


def read_text(path: str | os.PathLike, what: str = "file", max_bytes: int | None = None) -> str:
    """:func:`read_bytes` decoded as UTF-8 (one line if it is not)."""
    data = read_bytes(path, what, max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise HeadRankError(f"cannot read the {what} {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def read_json(path: str | os.PathLike, what: str = "JSON file") -> Any:
    """A JSON file parsed; one line for a missing, special, unreadable, malformed, non-UTF-8,
    too large (:data:`JSON_CAPS`) or too deeply nested file, or one whose parse would need more
    memory than :func:`json_budget`."""
    data = read_bytes(path, what)
    return parse_json(data, what, path)


def json_cost(data: bytes) -> int:
    """An upper estimate of the bytes ``json.loads(data)`` allocates (measured: about 75 bytes per
    ``{}``, 67 per ``[]``, 210 per ``"key": {}`` pair, 4 to 25 times the text overall), counted
    in C speed before anything is parsed."""
    return (3 * len(data) + 100 * (data.count(b"{") + data.count(b"[")) + 160 * data.count(b":")
            + 40 * data.count(b","))


def memory_available() -> int:
    """Memory available now (``MemAvailable``), else this machine's memory."""
    try:
        with open("/proc/meminfo") as fh:
            return next(int(line.split()[1]) << 10 for line in fh if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return memory_bytes()


def json_budget() -> int:
    """The memory one JSON parse may take: :data:`JSON_BUDGET`, and at most half the memory
    available now."""
    return min(JSON_BUDGET, memory_available() // 2)


def parse_json(data: bytes | bytearray, what: str, where: Any) -> Any:
    """``data`` (the text of a ``what`` at ``where``) parsed, after its byte cap
    (:data:`JSON_CAPS`) and memory budget (:func:`json_cost` within :func:`json_budget`)
    are checked; one line for a malformed, non-UTF-8 or too deeply nested text."""
    cap = JSON_CAPS.get(what, MAX_JSON_BYTES)
    if len(data) > cap:
        raise HeadRankError(f"{where}: the {what} is {len(data):,} bytes, more than a {what} may be "
                            f"({cap >> 20} MiB)")
    cost, budget = json_cost(bytes(data) if isinstance(data, bytearray) else data), json_budget()
    if cost > budget:
        raise HeadRankError(f"{where}: parsing the {what} ({len(data):,} bytes) would take about {_gib(cost)} of "
                            f"memory, more than the {_gib(budget)} allowed for it")
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as e:
        raise HeadRankError(f"cannot read the {what} {where}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise HeadRankError(f"cannot parse {where}: nested too deeply") from None
    except ValueError as e:
        raise HeadRankError(f"cannot parse {where}: {one_line(e, 200)}") from None


# safetensors' dtypes and their sizes in bytes (the checks below; what can be *read* is tensor_source.ST_DTYPES)
ST_SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2, "F16": 2,
            "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8}
MAX_ST_HEADER = 100 << 20  # safetensors' own limit on a header's length


def safetensors_entries(header: Any, data_len: int, where: Any) -> dict[str, tuple[str, tuple[int, ...], int, int]]:
    """The tensors of a parsed safetensors header as ``name -> (dtype, shape, start, end)`` (byte
    offsets within the data section of ``data_len`` bytes), refused as safetensors refuses a
    file: an entry that is malformed, whose span does not match its shape and dtype, that lies
    outside the data, or that overlaps another or leaves a gap ("invalid offset"). The one check
    of local (:mod:`headrank.io.stfile`) and remote (:mod:`headrank.io.remote`) headers."""
    if not isinstance(header, dict):
        raise HeadRankError(f"{where}: corrupt safetensors header (not a JSON object)")
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (b, end) = e["dtype"], tuple(e["shape"]), e["data_offsets"]
            if not all(isinstance(x, int) and not isinstance(x, bool) for x in (b, end, *shape)) or \
                    not 0 <= b <= end or any(s < 0 for s in shape) or not isinstance(dtype, str):
                raise ValueError
        except (TypeError, KeyError, ValueError):
            raise HeadRankError(f"{where}: corrupt safetensors header entry for {name!r}") from None
        if dtype in ST_SIZES:
            want = math.prod(shape) * ST_SIZES[dtype]
            if end - b != want:
                raise HeadRankError(f"{where}: tensor {name} spans {end - b:,} bytes but its shape and dtype need "
                                    f"{want:,}")
        if end > data_len:
            raise HeadRankError(f"{where}: tensor {name} lies at data bytes {b:,}-{end - 1:,}, outside the file "
                                f"({data_len:,} bytes of data)")
        out[name] = (dtype, shape, b, end)
    at = 0
    for name, (_, _, b, end) in sorted(out.items(), key=lambda kv: (kv[1][2], kv[1][3])):
        if b != at:
            how = "overlaps the tensor before it" if b < at else f"leaves bytes {at:,}-{b - 1:,} unaccounted for"
            raise HeadRankError(f"{where}: invalid offset: tensor {name} (data bytes {b:,}-{end - 1:,}) {how}")
        at = end
    return out


def inside(root: Path, name: Any, where: str) -> Path:
    """``root / name`` for a relative ``name`` that stays inside ``root`` (no ``..``, no absolute
    path); symlinks inside ``root`` are followed as usual (the Hugging Face cache uses them)."""
    if not isinstance(name, str) or not name or "\0" in name:
        raise HeadRankError(f"{where}: a file name must be a non-empty string; got {_show(name)}")
    norm = os.path.normpath(name)
    if os.path.isabs(name) or norm == ".." or norm.startswith(".." + os.sep) or norm == ".":
        raise HeadRankError(f"{where}: {name!r} lies outside the checkpoint directory {root}")
    return root / norm


# -- patterns and sizes ----------------------------------------------------------------------
def tensor_pattern(pattern: Any, where: str, *, need_i: bool = True) -> str:
    """A tensor name template that uses only ``{i}`` (the layer index): no other field, no
    attribute or index access, no conversion or format spec; ``{{``/``}}`` are literal braces."""
    if not isinstance(pattern, str) or not pattern:
        raise HeadRankError(f"{where}: a tensor name must be a non-empty string; got {_show(pattern)}")
    try:
        fields = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(pattern) if f is not None]
    except ValueError as e:
        raise HeadRankError(f"{where}: bad tensor name {pattern!r}: {e}") from None
    for f, spec, conv in fields:
        if f != "i" or spec or conv:
            raise HeadRankError(f"{where}: tensor name {pattern!r} may use only {{i}} (the layer index); "
                                f"got {{{f}{'!' + conv if conv else ''}{':' + spec if spec else ''}}}")
    if need_i and not fields:
        raise HeadRankError(f"{where}: tensor name {pattern!r} must contain {{i}} (the layer index)")
    return pattern


def memory_bytes() -> int:
    """Physical memory of this machine in bytes (a large number where it cannot be read)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 1 << 50


def check_fits(nbytes: int, what: str) -> None:
    """Refuse, before allocating, something that needs more bytes than this machine's memory."""
    have = memory_bytes()
    if nbytes > have:
        raise HeadRankError(f"{what} would need {_gib(nbytes)} of memory; this machine has {_gib(have)}")


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.3g} GiB"


def check_dtype(name: str, dtype: Any, where: Any) -> None:
    """Weights must be real floating point numbers: complex and bool refused, and integers and
    float8, which are quantization codes unless a scheme (:mod:`headrank.io.schemes`) turned them
    into weights first: a code is never read as a weight. ``dtype``: a dtype, or the tensor itself
    (a numpy read's bfloat16, raw bits in uint16, is then known as bfloat16)."""
    if type(dtype).__name__ == "BF16Bits":  # headrank.util.bf16: bfloat16 patterns, not integers
        return
    s = str(getattr(dtype, "dtype", dtype)).removeprefix("torch.")
    if s.startswith("complex") or s in ("C64", "C128", "C32") or s in ("bool", "BOOL"):
        raise HeadRankError(f"tensor {name} in {where} has dtype {s}: attention weights must be real numbers")
    if s.startswith(("int", "uint", "float8", "qint", "quint")) or s in ("I8", "U8", "I16", "I32", "I64", "F8_E4M3",
                                                                        "F8_E5M2"):
        raise HeadRankError(f"tensor {name} in {where} is stored as {s}: quantization codes, and no quantization_config "
                            "in config.json explains them (a code is not a weight; docs/quantized.md)")
