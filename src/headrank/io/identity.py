"""What a local checkpoint was when it was read: each file's identity, taken when a reader opened it.

A reader records every local file it opens (weights, config.json) in its
:class:`Stamps`: device, inode, size and modification time (ns), from the open descriptor
where there is one. The identity is checked again, by path, after the last read and before an
output is committed (:meth:`Stamps.check`): a file truncated or rewritten in place (size, time)
or replaced by rename (another inode) meanwhile gives one line, ``FILE changed while it was
read``, and nothing is written. The same records give the checkpoint's fingerprint
(:meth:`Stamps.fingerprint`), which a re-run compares before it reuses a table measured earlier
(``track``'s checkpoints). A file read with ``pread`` is also checked after every read
(:mod:`headrank.io.stfile`); one that is replaced by rename keeps its old inode open, so only
this check by path sees it.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from headrank.errors import HeadRankError

Stamp = tuple[int, int, int, int]  # device, inode, size, modification time (ns)


def stamp_of(st: os.stat_result) -> Stamp:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _absolute(path: str | os.PathLike) -> str:
    """``path`` made absolute against the cwd, ``..`` kept: os.path.abspath would drop ``link/..``
    by its spelling, naming another file than the one opened when ``link`` is a symlink."""
    p = os.fspath(path)
    return p if os.path.isabs(p) else os.path.join(os.getcwd(), p)


class FileChanged(HeadRankError):
    """A file changed while it was read: reading it again reads another file (not worth a retry)."""


def changed(path: Any) -> FileChanged:
    """The one line for a file that changed while it was read."""
    return FileChanged(f"{path} changed while it was read (another process truncated, rewrote or replaced it); "
                         "nothing was written: read it again once it is complete")


class Stamps:
    """The local files a reader opened, each with its :data:`Stamp` at open (module docstring)."""

    def __init__(self, root: str | os.PathLike | None = None) -> None:
        self._files: dict[str, Stamp] = {}
        self.root = root  # the checkpoint's file or directory (its fingerprint names files relative to it)

    def add(self, path: str | os.PathLike, stamp: Stamp | None = None) -> None:
        """Record ``path`` (as it was opened: a symlink is followed by the later checks as by the
        open) with ``stamp`` (from its open descriptor), or its identity now; the first record
        of a path is kept. A file that cannot be stat'ed is not recorded: the read that follows
        gives its own line."""
        key = _absolute(path)
        if key in self._files:
            return
        if stamp is None:
            try:
                stamp = stamp_of(os.stat(key))
            except OSError:
                return
        self._files[key] = stamp

    def discard(self, path: str | os.PathLike) -> None:
        """Forget ``path`` (a temporary copy a reader parsed, not the checkpoint)."""
        self._files.pop(_absolute(path), None)

    def update(self, other: Stamps) -> None:
        """Add ``other``'s records (a reader built on another reader: an adapter over its base)."""
        for key, stamp in other._files.items():
            self._files.setdefault(key, stamp)

    def check(self) -> None:
        """Raise :func:`changed` for the first file whose identity now, by path, is not the one
        recorded (truncated, rewritten, replaced by rename, deleted)."""
        for key, stamp in self._files.items():
            try:
                now = stamp_of(os.stat(key))
            except OSError:
                raise changed(key) from None
            if now != stamp:
                raise changed(key)

    def fingerprint(self) -> str:
        """The checkpoint's identity as a short hex string: its resolved path (:attr:`root`) and
        each recorded file's name (relative to it), device, inode, size and modification time. A
        retrained run at the same path, or a file replaced by rename with its size and time kept,
        gives another."""
        root = self.root
        base = os.path.abspath(root) if root is not None else None
        lines = [str(Path(root).resolve())] if root is not None else []
        named = sorted((os.path.relpath(k, base) if base is not None and os.path.isdir(base) else Path(k).name, s)
                       for k, s in self._files.items())
        lines += [f"{name}:{dev}:{ino}:{size}:{mtime}" for name, (dev, ino, size, mtime) in named]
        return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:20]

    def __bool__(self) -> bool:
        return bool(self._files)

    def __len__(self) -> int:
        return len(self._files)
