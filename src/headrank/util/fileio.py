"""Atomic writes: every output file appears whole or not at all, and a set of files together.

- :func:`atomic_path` / :func:`write_atomic`: one file written beside its target under a hidden
  temporary name (``.NAME.PID.XXXX.tmpSUFFIX``) and renamed onto it only when complete.
- Whole output sets, ``--out`` checked and locked: :mod:`headrank.io.writer`, the one writer
  (its staging directories, ``.headrank-staging-PID-XXXX``, are named here).
- :func:`clean_stale`: temporaries of killed runs (their PID no longer alive) are removed.

Errors while writing (no space left, permission denied, read-only file system) become one
:class:`~headrank.errors.HeadRankError` naming the path.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from headrank.errors import HeadRankError, one_line

STAGING_PREFIX = ".headrank-staging-"
_TMP_RE = re.compile(r"^\..+\.(\d+)\.[^.]+\.tmp")  # .NAME.PID.XXXX.tmpSUFFIX
# a killed attnrank run (before the rename) left its staging directories under the old prefix
_STAGING_RE = re.compile(r"^\.(?:headrank|attnrank)-staging-(\d+)-")
_LEGACY_TMP_RE = re.compile(r"^\..+\.[A-Za-z0-9_]{8}\.tmp")  # before the PID was in the name
_LEGACY_AGE_S = 3600.0


def read_regular(path: str | os.PathLike, what: str, cap: int) -> bytes:
    """The bytes of a regular file of at most ``cap`` bytes: the one read of a file a user or
    another process may have planted (:func:`headrank.io.validate.read_bytes` adds the messages
    of its kind). It is opened without blocking (``O_NONBLOCK``: a FIFO put where a record was
    expected cannot hang the open) and checked on the open descriptor (``fstat``: a regular
    file, not a FIFO, device or directory, no larger than ``cap``), so nothing swapped in between
    a check and the read is read; at most ``cap + 1`` bytes are ever read (a file growing
    meanwhile is refused, not followed). OSError passes through."""
    import stat

    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else \
                "a device or socket"
            raise HeadRankError(f"{path} is not a regular file ({kind}): refusing to read it as a {what}")
        if st.st_size > cap:
            raise HeadRankError(f"{path} is larger than {cap:,} bytes ({st.st_size:,}), more than a {what} may be: "
                                f"not a {what}")
        chunks, left = [], cap + 1
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > cap:
        raise HeadRankError(f"{path} grew past {cap:,} bytes while being read, more than a {what} may be: not a {what}")
    return data


def write_error(e: OSError, path: str | os.PathLike, doing: str = "write") -> HeadRankError:
    """One line for an OSError met while writing ``path``."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return HeadRankError(f"no space left on the device: cannot {doing} {path}")
    if isinstance(e, PermissionError) or e.errno in (errno.EACCES, errno.EPERM):
        return HeadRankError(f"permission denied: cannot {doing} {path}")
    if e.errno == errno.EROFS:
        return HeadRankError(f"read-only file system: cannot {doing} {path}")
    reason = e.strerror or one_line(e, 200)
    return HeadRankError(f"cannot {doing} {path}: {reason}")


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only on success.

    An OSError (no space, permission) becomes an HeadRankError naming ``path``; the temporary
    file is removed either way.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp" + path.suffix,
                                   dir=path.parent)
        os.close(fd)
    except OSError as e:
        raise write_error(e, path) from None
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file ordinary permissions
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise write_error(e, path) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def prepare_out_dir(out: str | os.PathLike) -> Path:
    """Create the output directory ``out`` (and parents); one clear error if it cannot be."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise HeadRankError(f"`out` {out} exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise HeadRankError(f"cannot create output directory {out}: {e.strerror}") from None
    return out


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid > 0  # someone else's live process (or a number too large to be a PID: dead)
    return True


def clean_stale(out: str | os.PathLike, finish: Callable[[Path, Path], bool] | None = None) -> list[str]:
    """Remove temporaries of killed runs from ``out``: ``.NAME.PID.XXXX.tmp*`` files and
    staging directories whose process is gone, and old-style temporaries older than an hour.
    ``finish(stage, out)``, if given, is offered each dead run's staging directory first (the
    writer finishes a commit a kill interrupted). Returns the names removed; errors removing
    them are ignored (a later run tries again)."""
    removed = []
    try:
        entries = list(os.scandir(out))
    except OSError:
        return removed
    now = time.time()
    for e in entries:
        m = _STAGING_RE.match(e.name) or _TMP_RE.match(e.name)
        try:
            if m:
                stale = not _alive(int(m.group(1)))
            elif _LEGACY_TMP_RE.match(e.name):
                stale = now - e.stat(follow_symlinks=False).st_mtime > _LEGACY_AGE_S
            else:
                continue
            if not stale:
                continue
            if e.is_dir(follow_symlinks=False):
                if finish is not None and _STAGING_RE.match(e.name):
                    finish(Path(e.path), Path(out))
                shutil.rmtree(e.path)
            else:
                os.unlink(e.path)
            removed.append(e.name)
        except OSError:
            continue
    return removed


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: str | os.PathLike, write: Callable[[Path], Any]) -> Path:
    """Call ``write(tmp_path)`` and move the result onto ``path`` atomically."""
    with atomic_path(path) as tmp:
        write(tmp)
    return Path(path)


def write_text(path: str | os.PathLike, text: str) -> Path:
    return write_atomic(path, lambda p: p.write_text(text, encoding="utf-8"))


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    return write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def _json_default(o: Any) -> Any:
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def jsonable(obj: Any) -> Any:
    """Plain JSON types: numpy/torch scalars and arrays to Python, non-finite floats to None."""
    import numpy as np

    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if isinstance(obj, bool | str) or obj is None:
        return obj
    if isinstance(obj, int) and not isinstance(obj, bool):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return jsonable(float(obj))
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "detach") and hasattr(obj, "cpu"):  # torch tensor
        return jsonable(obj.detach().cpu().numpy())
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
