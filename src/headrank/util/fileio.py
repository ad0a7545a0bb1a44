"""Atomic writes: every output file appears whole or not at all, and a set of files together.

- :func:`atomic_path` / :func:`write_atomic`: one file written beside its target under a hidden
  temporary name (``.NAME.PID.XXXX.tmpSUFFIX``) and renamed onto it only when complete.
- :func:`staged_output`: a whole output set (heads.csv, meta.json, figures, ...) written into a
  fresh hidden directory inside ``--out`` (``.headrank-staging-PID-XXXX``) and moved in only
  when every file is written, so a failure (a full disk, a kill) never leaves new files beside
  the previous run's.
- :func:`check_writable`: ``--out`` created and probed before an analysis starts.
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


def check_writable(out: str | os.PathLike) -> Path:
    """Check, before any long analysis, that files can be written in ``out``: an existing
    directory is probed with a temporary file (and temporaries left there by killed runs are
    cleaned); a missing one is not created yet (a run that fails leaves nothing behind), but its
    nearest existing ancestor must be a directory the user may write. One line naming ``out``
    otherwise."""
    out = Path(out)
    if out.exists():
        if not out.is_dir():
            raise HeadRankError(f"`out` {out} exists and is not a directory")
        try:
            fd, probe = tempfile.mkstemp(prefix=f".headrank-probe.{os.getpid()}.", suffix=".tmp", dir=out)
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            raise write_error(e, out, "write into") from None
        clean_stale(out)
        return out
    parent = out.absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise HeadRankError(f"cannot create output directory {out}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise HeadRankError(f"permission denied: cannot create output directory {out} (in {parent})")
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


@contextmanager
def staged_output(out: str | os.PathLike) -> Iterator[Path]:
    """Write a set of output files together: yields a fresh hidden directory inside ``out``;
    when the block ends without error every file in it is moved onto ``out`` (renames within
    one directory tree: no new data is written, so a full disk cannot leave half a set), else
    the directory is removed and ``out`` keeps the previous set untouched."""
    out = check_writable(prepare_out_dir(out))
    try:
        stage = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-", dir=out))
    except OSError as e:
        raise write_error(e, out, "write into") from None
    try:
        yield stage
        _move_set(stage, out)
    except OSError as e:
        raise write_error(e, getattr(e, "filename", None) or out) from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _move_set(stage: Path, out: Path) -> None:
    """Move every entry of ``stage`` onto ``out`` as one set: a name that is a directory in
    ``out`` where the set has a file is refused before anything moves; the previous entries are
    set aside first and put back if any move fails, so ``out`` holds the old set or the new one."""
    entries = sorted(stage.iterdir())
    for p in entries:
        t = out / p.name
        if t.is_dir() and not t.is_symlink() and not p.is_dir():
            raise HeadRankError(f"cannot write {t}: a directory of that name is in the way; "
                                "remove it or choose another `out`")
    aside = Path(tempfile.mkdtemp(prefix=".previous-", dir=stage))
    done: list[str] = []
    try:
        for p in entries:
            t = out / p.name
            if t.exists() or t.is_symlink():
                os.replace(t, aside / p.name)
            done.append(p.name)
            os.replace(p, t)
    except BaseException:
        for name in reversed(done):
            t = out / name
            try:
                if not (stage / name).exists() and (t.exists() or t.is_symlink()):
                    shutil.rmtree(t) if t.is_dir() and not t.is_symlink() else t.unlink()
                if (aside / name).exists() or (aside / name).is_symlink():
                    os.replace(aside / name, t)
            except OSError:
                continue
        raise


def moved(paths: list[Path], stage: Path, out: str | os.PathLike) -> list[Path]:
    """The final paths in ``out`` (as the user gave it) of files written under ``stage``, for
    messages. ``stage`` and ``paths`` may be relative or absolute, or reach the same directory
    through a symlink: each is compared in absolute, then in resolved form."""
    return [Path(out) / _under(Path(p), Path(stage)) for p in paths]


def _under(p: Path, stage: Path) -> Path:
    for f in (os.path.abspath, os.path.realpath):
        try:
            return Path(f(p)).relative_to(f(stage))
        except ValueError:
            continue
    raise HeadRankError(f"internal: {p} was not written under {stage}")


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
