"""Hugging Face Hub ids, resolved through ``huggingface_hub``'s local cache.

An argument that is not an existing path but looks like ``org/name`` (or ``name``) is looked up
with ``snapshot_download(..., local_files_only=True)`` in the cache that ``HF_HUB_CACHE`` (or
``HF_HOME``/hub, else ``~/.cache/huggingface/hub``) names *at call time*. Nothing is fetched
unless ``download=True`` and the network is allowed (``HF_HUB_OFFLINE`` unset); then only the
config and weight files are fetched (:data:`FETCH_PATTERNS`), into the normal cache.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

from headrank.errors import HeadRankError, one_line

# what `headrank spectra ID` needs: configs and weights, never tokenizers, optimizer states, ...
FETCH_PATTERNS = ("*.json", "*.safetensors", "pytorch_model*.bin")
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$")


def looks_like_repo_id(s: str) -> bool:
    """``org/name`` or ``name`` in the Hub's alphabet (no path separators beyond one ``/``,
    no ``..``, no file suffix such as ``.gguf`` / ``.safetensors``)."""
    if not _REPO_ID.match(s) or ".." in s or s.endswith((".gguf", ".safetensors", ".bin", ".pt", ".json")):
        return False
    return True


def cache_dir() -> Path:
    """The hub cache directory as the environment names it now."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.path.expanduser(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        return Path(os.path.expanduser(os.environ["HF_HOME"])) / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "huggingface" / "hub"


def offline() -> bool:
    """True where the network is off for the Hub (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``)."""
    return any(os.environ.get(k, "").strip().upper() in ("1", "ON", "YES", "TRUE")
               for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def fetch_command(repo_id: str, revision: str | None = None) -> str:
    """The shell command that fetches only what headrank reads (config and weights)."""
    rev = f" --revision {shlex.quote(revision)}" if revision else ""
    pats = " ".join(shlex.quote(p) for p in FETCH_PATTERNS)
    return f"hf download {shlex.quote(repo_id)}{rev} --include {pats}"


def cached_snapshot(repo_id: str, revision: str | None = None, *, download: bool = False) -> Path:
    """The local snapshot directory of ``repo_id`` at ``revision`` (default ``main``).

    Looks in the cache only; with ``download=True`` and the network allowed, fetches the config
    and weight files first. Not cached (or the network off): HeadRankError naming the command
    that fetches it.
    """
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HFValidationError
    except ImportError:  # pragma: no cover - a dependency of transformers
        raise HeadRankError(f"{repo_id!r} is not a local path, and huggingface_hub is not installed") from None
    where = cache_dir()
    if download:
        if offline():
            raise HeadRankError(f"`download`: the network is off (HF_HUB_OFFLINE); fetch {repo_id} elsewhere "
                                f"with: {fetch_command(repo_id, revision)}")
        try:
            return Path(snapshot_download(repo_id, revision=revision, cache_dir=where,
                                          allow_patterns=list(FETCH_PATTERNS)))
        except Exception as e:  # network, auth, not found: one line
            raise HeadRankError(f"cannot download {repo_id}: {one_line(e, 300)}") from None
    check_cached_ref(where, repo_id, revision)
    try:
        path = Path(snapshot_download(repo_id, revision=revision, cache_dir=where, local_files_only=True))
    except HFValidationError:
        raise HeadRankError(f"no such file or directory: {repo_id}") from None
    except Exception:  # LocalEntryNotFoundError and friends: not in this cache
        at = f" at revision {revision}" if revision else ""
        raise HeadRankError(
            f"no such file or directory, and {repo_id}{at} is not in the Hugging Face cache {where}: "
            f"fetch config and weights with `{fetch_command(repo_id, revision)}` "
            "(or pass `download` where the network is allowed)") from None
    inside_cache(path, where / repo_folder(repo_id), repo_id)
    if not (path / "config.json").exists() and not any(path.glob("*.gguf")) and not (
            path / "adapter_config.json").exists():
        raise HeadRankError(f"the cached snapshot of {repo_id} ({path}) has no config.json: fetch it with "
                            f"`{fetch_command(repo_id, revision)}`")
    return path


_COMMIT = re.compile(r"[0-9a-f]{40}")
MAX_REF_BYTES = 4096


def repo_folder(repo_id: str) -> str:
    """The cache folder of a model repository (``models--org--name``, huggingface_hub's layout)."""
    return "models--" + repo_id.replace("/", "--")


def check_cached_ref(cache: Path, repo_id: str, revision: str | None) -> None:
    """Before huggingface_hub reads ``refs/REVISION`` of ``repo_id`` in ``cache``: the revision
    names a file inside ``refs/`` (no ``..``, not absolute), the file is a small regular file (a
    FIFO would block the read, a symlink to /dev/zero would never end) and holds a commit hash
    (not ``../../../outside``, which would resolve a snapshot outside the cache)."""
    from headrank.io.validate import read_text

    rev = "main" if revision is None else str(revision)
    parts = rev.split("/")
    if (not rev or os.path.isabs(rev) or any(p in ("", ".", "..") for p in parts)
            or any(c.isspace() or ord(c) < 32 or c in "\\~^:?*[" for c in rev)):  # git's ref-name rules
        raise HeadRankError(f"`revision` {rev!r} is not a branch, tag or commit name")
    if _COMMIT.fullmatch(rev):
        return
    ref = cache / repo_folder(repo_id) / "refs" / rev
    if not os.path.lexists(ref):
        return  # not cached: huggingface_hub says so, and the caller names the fetch command
    text = read_text(ref, "Hub cache ref", max_bytes=MAX_REF_BYTES)
    if not _COMMIT.fullmatch(text):
        shown = text[:60] + ("..." if len(text) > 60 else "")
        raise HeadRankError(f"the Hugging Face cache ref {ref} holds {shown!r}, not a commit hash: "
                            "refusing to resolve it (a corrupt or tampered cache)")


def inside_cache(path: Path, repo_dir: Path, repo_id: str) -> None:
    """The resolved snapshot of ``repo_id`` must lie inside its cache folder."""
    try:
        ok = path.resolve().is_relative_to(repo_dir.resolve())
    except OSError:
        ok = False
    if not ok:
        raise HeadRankError(f"the cached snapshot of {repo_id} resolves to {path.resolve()}, outside its cache "
                            f"folder {repo_dir}: refusing to read it")
