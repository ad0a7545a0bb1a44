"""The one writer, the reader's twin: every output set a verb writes goes through :class:`OutputSet`.

    with OutputSet(out, sources=[src], owns="compress.json") as dest:   # checked once, locked
        ...the long work...
        with dest.stage() as stage:                                     # a fresh hidden directory
            write files into stage                                      # committed as one set

- **Checked once.** ``out`` is resolved once: a file, the source directory, a directory inside
  the source (or a symlink to either), and (with ``owns``) a non-empty directory that holds no
  output of this kind are refused in one line; a file of the set that ``out`` already holds and
  that headrank did not write (no record, no :data:`MARKS`) is refused before the commit: a
  user's file is never overwritten; a missing ``out`` is created for the run and
  removed again if the run fails.
- **Locked by its directory.** An exclusive ``flock`` on a descriptor of the directory itself
  (opened ``O_DIRECTORY | O_NOFOLLOW`` on the resolved path): no lock file, so nothing to plant
  a symlink at, and nothing left behind after success, failure or a kill. A second writer of
  the same ``out`` is refused at once with one line.
- **Staged, committed as a set.** Files are written into a hidden directory inside ``out`` (the
  same file system, so the commit is renames only: a full disk fails while staging, never half
  way through the set). The commit runs with SIGINT, SIGTERM and SIGHUP held back: ``out``
  holds the previous set or the new one, never a mix (a held signal acts once it is done). A
  kill that cannot be held (SIGKILL) mid-commit is finished by the next run: the staging
  directory says it was complete (:data:`COMPLETE`).
- **Stale files dropped only if this project wrote them.** Each set leaves a record
  (:data:`RECORD`: every file's name, size and a BLAKE2 fingerprint of its first and last MiB).
  A file of the previous set that the new one lacks is removed only when it is still a regular
  file of the recorded size and fingerprint: a planted record cannot name a user's file into
  deletion, nothing outside ``out`` is touched, no symlink is followed.
- **Nothing from a changed input.** :meth:`OutputSet.watch` takes the identities of the files
  a run read (:class:`headrank.io.identity.Stamps`); the commit checks them first, after the
  last file of the set is staged: a file truncated, rewritten or replaced by rename since it
  was opened is one line (``FILE changed while it was read``) and nothing moves.
- **No path from data.** :func:`confined` joins a name that came from data (a label, a figure
  name) onto a directory only when it is one plain component.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from headrank.errors import HeadRankError
from headrank.util.fileio import STAGING_PREFIX, clean_stale, write_error

RECORD = ".headrank-output.json"
COMPLETE = ".headrank-complete"
_RECORD_BYTES = 16 * 2**20
_PRINT_BYTES = 2**20
_HELD = tuple(s for s in (getattr(signal, n, None) for n in ("SIGINT", "SIGTERM", "SIGHUP")) if s is not None)
#: the files that mark a directory as a headrank output written before :data:`RECORD` existed
#: (spectra, collapse, scale and track's meta.json, a reproduction's run.json or report.html, a
#: study's data.json, a series' series.json, a sweep's sweep.json), at its top or one directory
#: down; a non-empty directory with none of them is foreign
MARKS = ("meta.json", "run.json", "report.html", "data.json", "series.json", "compress.json", "sweep.json")
_NAME_RE = re.compile(r"^[^/\\\x00]+$")


def confined(root: str | os.PathLike, name: Any, what: str = "name") -> Path:
    """``root / name`` for a ``name`` from data (a label, a stored figure name) that is one plain
    path component: no separator, not ``.``/``..``, no NUL, not hidden by a leading dot."""
    if not isinstance(name, str) or not _NAME_RE.match(name) or name in (".", "..") or name.startswith("."):
        raise HeadRankError(f"{what} {str(name)[:80]!r} is not a plain file name: refusing to derive a path from it")
    return Path(root) / name


def _holds_output(real: Path, names: list[str], marks: tuple[str, ...]) -> bool:
    """Whether ``real`` (its entries ``names``) is an output of this project: it, or one of its
    directories (a reproduction's parts, stopped before the report was written), holds the
    writer's :data:`RECORD` or one of ``marks``."""
    if RECORD in names or any(m in names for m in marks):
        return True
    for name in names[:256]:
        sub = real / name
        if not sub.is_symlink() and sub.is_dir():
            with suppress(OSError):
                inner = set(os.listdir(sub))
                if RECORD in inner or any(m in inner for m in marks):
                    return True
    return False


def _real(p: Path) -> Path:
    return Path(os.path.realpath(p))


def _within(p: Path, top: Path) -> bool:
    return p == top or top in p.parents


class OutputSet:
    """One output directory for one run (see the module's docstring). ``sources``: paths the run
    reads (a checkpoint directory or file), which ``out`` must not be or be inside. ``owns``:
    the file that marks an output of this kind (``compress.json``); with it, a non-empty
    directory holding neither it nor a :data:`RECORD` is refused. ``flag``: how messages name
    ``out``. ``held``: the caller holds the directory's lock already (:func:`lock_dir`)."""

    def __init__(self, out: str | os.PathLike, *, sources: Iterable[str | os.PathLike | None] = (),
                 owns: str | None = None, flag: str = "`out`", held: bool = False):
        if not isinstance(out, (str, os.PathLike)) or not str(out):
            raise HeadRankError(f"{flag} must be a directory path; got {type(out).__name__}")
        self.out, self.flag, self.owns = Path(out), flag, owns
        self.sources = [Path(s) for s in sources if s is not None]
        self.real: Path | None = None
        self.fd: int | None = None
        self.created = False
        self.committed = False
        self.held = held  # the caller holds the directory's lock already (a sweep's whole run)
        self.entered = False
        self.inputs: list[Any] = []  # the identities of the files read, checked before the commit

    # -- checked once, locked ------------------------------------------------------------------
    def __enter__(self) -> OutputSet:
        self.real = self._check()
        try:
            self._lock()
            self.entered = True
            clean_stale(self.real, finish=_roll_forward)
        except BaseException:
            self._release(failed=True)
            raise
        return self

    def __exit__(self, kind: Any, *exc: Any) -> bool:
        self._release(failed=kind is not None)
        return False

    def _check(self) -> Path:
        out = self.out
        if out.is_symlink() and not out.exists():
            raise HeadRankError(f"{self.flag} {out} is a dangling symlink: refusing to write through it")
        if out.exists() and not out.is_dir():
            raise HeadRankError(f"{self.flag} {out} exists and is not a directory")
        real = _real(out)
        self._refuse(real, self.sources)
        if real.is_dir():
            names = [e for e in os.listdir(real) if not _ours_temporary(e)]
            if names and self.owns is not None and not _holds_output(real, names, (self.owns,)):
                raise HeadRankError(f"{self.flag} {out} is not empty and holds no {self.owns}: choose an empty or new "
                                    "directory")
        if not real.exists():
            parent = real.parent
            while not parent.exists() and parent != parent.parent:
                parent = parent.parent
            if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
                raise HeadRankError(f"permission denied: cannot create output directory {out} (in {parent})")
        elif not os.access(real, os.W_OK | os.X_OK):
            raise HeadRankError(f"permission denied: cannot write into {out}")
        return real

    def _refuse(self, real: Path, sources: Iterable[Path]) -> None:
        for src in sources:
            s = _real(Path(src))
            top = s if s.is_dir() else s.parent
            if _within(real, top):
                where = "is the source directory" if real == top else "is inside the source directory"
                raise HeadRankError(f"{self.flag} {self.out} {where} {top}: writing there would change the input; "
                                    "choose another directory")

    def refuse_sources(self, sources: Iterable[str | os.PathLike]) -> None:
        """The same check for the paths a source name led to once it was opened ('minilm', a Hub
        id): ``out`` may be none of them nor inside one."""
        self._refuse(self.real, [Path(s) for s in sources])

    def _lock(self) -> None:
        real = self.real
        if not real.exists():
            try:
                real.mkdir(parents=True)
                self.created = True
            except FileExistsError:
                pass
            except OSError as e:
                raise write_error(e, self.out, "create") from None
        if not self.held:
            self.fd = lock_dir(real, f"{self.flag} {self.out}")

    def _release(self, failed: bool) -> None:
        self.entered = False
        if self.fd is not None:
            os.close(self.fd)  # releases the lock
            self.fd = None
        if failed and self.created and self.real is not None:
            with suppress(OSError):
                self.real.rmdir()  # only if empty: a failed run leaves no --out behind

    # -- staged, committed ---------------------------------------------------------------------
    @contextmanager
    def stage(self) -> Iterator[Path]:
        """A fresh hidden directory inside ``out``; when the block ends without error its
        files become ``out``'s set (:meth:`commit`); otherwise it is removed."""
        if not self.entered:
            raise HeadRankError("internal: OutputSet.stage() outside its `with` block")
        try:
            stage = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-", dir=self.real))
        except OSError as e:
            raise write_error(e, self.out, "write into") from None
        try:
            yield stage
            self.commit(stage)
        except OSError as e:
            raise write_error(e, getattr(e, "filename", None) or self.out) from None
        finally:
            shutil.rmtree(stage, ignore_errors=True)

    def watch(self, stamps: Any) -> None:
        """Check ``stamps`` (:class:`headrank.io.identity.Stamps`: the files the run read, each
        with its identity when opened) before the commit: a file that changed meanwhile is one
        line and nothing is committed. None: nothing to watch (a model in memory, a remote read)."""
        if stamps is not None:
            self.inputs.append(stamps)

    def commit(self, stage: Path) -> None:
        for stamps in self.inputs:  # after the last file is staged: the inputs are still what was read
            stamps.check()
        record = {"writer": "headrank", "version": 1, "files": _record(stage)}
        (stage / RECORD).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        old = read_record(self.real)
        self._refuse_overwrite(stage, old)
        with _held_signals():
            (stage / COMPLETE).touch()
            move_set(stage, self.real)
            drop_stale(self.real, old, record["files"])
        self.committed = True

    def _refuse_overwrite(self, stage: Path, old: dict[str, list]) -> None:
        """A file of the new set that is already in ``out``, where neither the writer's record nor
        an earlier output of this project (:data:`MARKS`) says headrank wrote it, is a user's file:
        refused in one line before anything moves (``out`` may hold other files of the user's)."""
        names = [e for e in os.listdir(self.real) if not _ours_temporary(e) and e != stage.name]
        if not names or _holds_output(self.real, names, MARKS):
            return
        ours = {rel.split("/")[0] for rel in old}
        for p in sorted(stage.iterdir()):
            t = self.real / p.name
            if p.name not in (RECORD, COMPLETE) and p.name not in ours and (t.exists() or t.is_symlink()):
                raise HeadRankError(f"{self.flag} {self.out} already holds {p.name}, which headrank did not write: "
                                    "refusing to overwrite it; choose an empty or new directory")

    def moved(self, paths: Iterable[str | os.PathLike], stage: Path) -> list[Path]:
        """The final paths, in ``out`` as the user gave it, of files written under ``stage``."""
        return [self.out / Path(os.path.abspath(p)).relative_to(os.path.abspath(stage)) for p in paths]


@contextmanager
def staged(out: str | os.PathLike, **kw: Any) -> Iterator[tuple[OutputSet, Path]]:
    """Check, lock, stage and commit in one block (a verb whose work is done before it writes)."""
    with OutputSet(out, **kw) as dest, dest.stage() as stage:
        yield dest, stage


def lock_dir(path: Path, what: str) -> int:
    """An exclusive ``flock`` on a descriptor of the directory ``path`` itself (no lock file; a
    symlink at ``path`` is refused): the descriptor, whose closing releases it (so does the
    holder's death). Held by another process: one line naming it and that process's PID."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise HeadRankError(f"{what} is not a directory (a symlink?): refusing to write there") from None
        raise write_error(e, path, "open") from None
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: unlocked
        return fd
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pid = lock_holder(fd)
        os.close(fd)
        raise HeadRankError(f"{what} is being written by another process (pid {pid or 'unknown'}): one writer "
                            "at a time; wait for it to finish or stop it") from None
    return fd


def lock_holder(fd: int) -> int | None:
    """The PID holding a ``flock`` on the file of ``fd``, from ``/proc/locks`` (None elsewhere)."""
    try:
        st = os.fstat(fd)
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            text = f.read(4 * 2**20)
    except OSError:
        return None
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in text.splitlines():
        parts = line.split()
        if len(parts) > 5 and parts[1] == "FLOCK" and parts[5] == key and parts[4].isdigit():
            return int(parts[4])
    return None


def dir_locked(path: str | os.PathLike) -> bool:
    """Whether a live process holds the writer's lock on the directory ``path`` now."""
    try:
        import fcntl

        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except (ImportError, OSError):
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def save_set(out: str | os.PathLike, save: Any, **kw: Any) -> list[Path]:
    """``save(stage)`` (which returns the paths it wrote) as one output set into ``out``: checked,
    locked, staged and committed (the Python API's ``Result.save``); the final paths."""
    with staged(out, **kw) as (dest, stage):
        files = save(stage)
    return dest.moved(files, stage)


def _ours_temporary(name: str) -> bool:
    return name.startswith((STAGING_PREFIX, ".headrank-probe.", ".attnrank-staging-"))


@contextmanager
def _held_signals() -> Iterator[None]:
    """SIGINT, SIGTERM, SIGHUP held back for the block (the main thread only; acted on after)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def fingerprint(path: Path, size: int) -> str:
    """BLAKE2b of the size, the first and the last MiB (a file opened without following links)."""
    h = hashlib.blake2b(str(size).encode(), digest_size=16)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    try:
        h.update(os.pread(fd, _PRINT_BYTES, 0))
        if size > _PRINT_BYTES:
            h.update(os.pread(fd, _PRINT_BYTES, max(_PRINT_BYTES, size - _PRINT_BYTES)))
    finally:
        os.close(fd)
    return h.hexdigest()


def _record(stage: Path) -> dict[str, list]:
    """Every regular file under ``stage``: relative name -> [size, fingerprint]."""
    files = {}
    for root, dirs, names in os.walk(stage):
        dirs[:] = [d for d in dirs if not d.startswith(".previous-")]
        for n in names:
            p = Path(root) / n
            st = p.lstat()
            if stat.S_ISREG(st.st_mode) and n not in (RECORD, COMPLETE):
                files[p.relative_to(stage).as_posix()] = [st.st_size, fingerprint(p, st.st_size)]
    return dict(sorted(files.items()))


def read_record(out: Path) -> dict[str, list]:
    """The files of the previous set as its record lists them ({} when there is none, or it is not
    a regular file of at most 16 MiB holding the writer's JSON)."""
    try:
        fd = os.open(out / RECORD, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return {}
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _RECORD_BYTES:
            return {}
        data = json.loads(os.pread(fd, _RECORD_BYTES, 0))
    except (OSError, ValueError):
        return {}
    finally:
        os.close(fd)
    files = data.get("files") if isinstance(data, dict) else None
    return {k: v for k, v in files.items() if isinstance(k, str) and isinstance(v, list) and len(v) == 2} \
        if isinstance(files, dict) else {}


def _plain(rel: str) -> bool:
    parts = rel.split("/")
    return bool(rel) and not rel.startswith("/") and all(p not in ("", ".", "..") and "\\" not in p and "\x00" not in p
                                                       for p in parts)


def drop_stale(out: Path, old: dict[str, list], new: dict[str, list]) -> list[str]:
    """Remove the previous set's files that the new set lacks, each only if it is still the
    regular file the record describes (size and fingerprint), reached without a symlink; then
    the directories they leave empty. Returns the names removed."""
    removed, dirs = [], set()
    for rel, (size, print_) in old.items():
        if rel in new or not _plain(rel):
            continue
        p = out / rel
        if any((out / Path(*rel.split("/")[:i])).is_symlink() for i in range(1, rel.count("/") + 2)):
            continue
        try:
            st = p.lstat()
            if not stat.S_ISREG(st.st_mode) or st.st_size != size or fingerprint(p, size) != print_:
                continue
            p.unlink()
        except OSError:
            continue
        removed.append(rel)
        dirs.update(str(Path(*rel.split("/")[:i])) for i in range(1, rel.count("/") + 1))
    for d in sorted(dirs, key=len, reverse=True):
        with suppress(OSError):
            (out / d).rmdir()  # only an empty one
    return removed


def move_set(stage: Path, out: Path) -> None:
    """Move every entry of ``stage`` onto ``out`` (renames: a symlink in the way is replaced,
    never followed): a name that is a directory in ``out`` where the set has a file is refused
    before anything moves; the previous entries are set aside first and put back if a move
    fails."""
    entries = sorted((p for p in stage.iterdir() if p.name != COMPLETE and not p.name.startswith(".previous-")),
                     key=lambda p: (p.name == RECORD, p.name))  # the record last: it names a set all in
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
        _put_back(stage, aside, out, done)
        raise


def _put_back(stage: Path, aside: Path, out: Path, done: list[str]) -> None:
    for name in reversed(done):
        t = out / name
        try:
            if not (stage / name).exists() and (t.exists() or t.is_symlink()):
                shutil.rmtree(t) if t.is_dir() and not t.is_symlink() else t.unlink()
            if (aside / name).exists() or (aside / name).is_symlink():
                os.replace(aside / name, t)
        except OSError:
            continue


def _roll_forward(stage: Path, out: Path) -> bool:
    """A killed run's complete staging directory (:data:`COMPLETE`): finish its commit. Returns
    True when done (the caller then removes the directory)."""
    if not (stage / COMPLETE).is_file():
        return False
    if not (stage / RECORD).is_file():  # the record moves last: the set is in (its stale files may stay)
        return True
    old, new = read_record(out), read_record(stage)
    for p in sorted((p for p in stage.iterdir() if p.name != COMPLETE and not p.name.startswith(".previous-")),
                    key=lambda p: (p.name == RECORD, p.name)):
        t = out / p.name
        if t.is_dir() and not t.is_symlink() and p.is_dir():
            shutil.rmtree(t)
        os.replace(p, t)
    drop_stale(out, old, new)
    return True


def write_now(path: Path, data: bytes | str) -> Path:
    """One file written whole beside its final name and renamed onto it (a symlink at ``path`` is
    replaced, never written through): for the files a resumable run writes as it goes."""
    from headrank.util.fileio import write_atomic

    raw = data.encode("utf-8") if isinstance(data, str) else data
    return write_atomic(path, lambda p: p.write_bytes(raw))


def append_no_follow(path: Path, text: str) -> None:
    """Append ``text`` to the regular file ``path`` (created if missing); a symlink or anything
    else at ``path`` is refused in one line."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0),
                     0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise HeadRankError(f"{path} is a symlink: refusing to write through it") from None
        raise write_error(e, path) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise HeadRankError(f"{path} is not a regular file: refusing to append to it")
        data = memoryview(text.encode("utf-8"))
        while data:
            data = data[os.write(fd, data):]
    except OSError as e:
        raise write_error(e, path) from None
    finally:
        os.close(fd)
