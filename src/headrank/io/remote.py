"""Checkpoints read over HTTP(S) byte ranges: only what the analysis needs travels.

Sources (:func:`open_remote`):

- a Hugging Face Hub id (``org/name``, ``revision=`` a branch, tag or commit): files resolve at
  ``{HF_ENDPOINT}/{repo}/resolve/{revision}/{file}`` (``huggingface_hub.hf_hub_url``; the
  endpoint is read from ``HF_ENDPOINT`` at call time); the token is ``huggingface_hub``'s
  (``HF_TOKEN``, else the saved login). The commit the first answer names (``X-Repo-Commit``)
  pins every later file, so a branch that moves mid-run cannot mix two checkpoints;
- an ``http(s)://`` URL of a checkpoint directory (``config.json`` + ``model.safetensors`` or a
  sharded ``model.safetensors.index.json``), of one ``.safetensors`` file (its sibling
  ``config.json``, or ``config=`` a local one), or of a ``.gguf`` file. The Hub token is sent
  only over https to the Hub endpoint's exact scheme, host and port
  (:func:`headrank.io.httpio.sends_token`), and every URL shown or stored is redacted
  (:mod:`headrank.util.redact`; docs/remote-security.md).

What is fetched: ``config.json``, the shard index, each safetensors header (8 bytes, then the
header's own length), then only the tensors the reader asks for (the attention projections of
one layer at a time, the next layer prefetched by :mod:`headrank.analysis.scan`, a layer's
tensors fetched concurrently; the norm gains with ``fold_norm``), each as one ranged GET into
memory. No weight is written to disk. A GGUF
header has no length prefix: it is fetched in growing chunks (1 MiB, x4 each time, at most
:data:`headrank.io.gguf.MAX_GGUF_HEADER`, the header's caps checked on each chunk) into a sparse
temporary file that only ``gguf.GGUFReader`` parses
(metadata, never tensor data; deleted at once) until the parsed header ends inside what was
fetched.

HTTP goes through the client of :func:`headrank.io.httpio.session` (httpx2, as
``huggingface_hub``'s own: redirects followed; ``HF_HUB_OFFLINE`` checked first) and
``huggingface_hub``'s ``hf_raise_for_status`` (missing repo, revision or file, gated repo,
authentication; an error answer is read to :data:`headrank.io.httpio.MAX_ERROR_BODY` bytes at
most). Every answer is checked: a ranged GET must come back ``206`` with the ``Content-Range``
asked for and exactly that many bytes. A dropped connection, a timeout, a short body or a 5xx
answer is retried (:data:`RETRIES` more tries, waits from :data:`BACKOFF_S` doubling), then
fails with one line; wrong numbers are never returned. Every request has a total deadline
besides the read timeout (:func:`headrank.io.httpio.deadline_s`), and every socket operation of
it (the connection, the status line, the headers, the body) ends there: a server that drips
any part of its answer a byte at a time is one line. A server that ignores ``Range`` (``200``
with the whole file) is refused unless ``allow_full``: then each such file is downloaded whole,
once, into a temporary file deleted on close, if its ``Content-Length`` is within ``max_bytes``
(by default twice the attention bytes that the safetensors header at the file's start lists,
read before any byte is written; 4 GiB when that is not known; a file with no attention tensor
keeps its header only). JSON (config, index, headers) is bounded per kind and parsed within a
memory budget (:func:`headrank.io.validate.parse_json`).

``Transfer.stats`` (``meta.json``'s ``remote``) counts every byte received: tensors, metadata,
requests, retries, and the share of the checkpoint's weight files that was fetched.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urljoin, urlsplit

import numpy as np
import torch

from headrank.errors import HeadRankError, one_line
from headrank.io.checkpoint import HF_WEIGHTS
from headrank.io.httpio import (
    TMP_PREFIX,
    Transfer,
    _check_status,
    _Clock,
    _content_range,
    _http_errors,
    _mb,
    _Retry,
    endpoint,
    sends_token,
    stream,
    sweep_temp,
    transfer_line,  # noqa: F401 - the CLI's import
)
from headrank.io.tensor_source import ST_DTYPES, BaseCheckpoint, TensorMeta, dtype_name
from headrank.io.validate import (
    JSON_CAPS,
    MAX_JSON_BYTES,
    MAX_ST_HEADER,
    parse_json,
    safetensors_entries,
)
from headrank.util.legacy import upgrade
from headrank.util.redact import redact_text, redact_url

RETRIES = 3  # more tries of one request after a dropped connection, a timeout, a short body or a 5xx
BACKOFF_S = 0.5  # first wait between tries; doubles
MAX_HEADER = min(MAX_ST_HEADER, JSON_CAPS["safetensors header"])  # bytes of one safetensors header
GGUF_FIRST_CHUNK = 1 << 20
HEADER_THREADS = 8  # shard headers fetched concurrently
FETCH_THREADS = 16  # one layer's stored tensors (weights and their scales) fetched concurrently
MAX_FULL_BYTES = 4 << 30  # --allow-full: the most one file downloaded whole may hold (--max-bytes)


def is_url(source: Any) -> bool:
    """An ``http://`` or ``https://`` address."""
    return isinstance(source, str) and source[:8].lower().startswith(("http://", "https://"))


@dataclass
class Location:
    """Where a remote checkpoint's files are: a Hub repo at a revision, or a base URL (ends in /)."""

    label: str
    base: str | None = None
    repo_id: str | None = None
    revision: str | None = None
    endpoint: str | None = None
    commit: str | None = None
    file: tuple[str, str] | None = None  # (name, exact URL) of a URL that names one file

    def url(self, filename: str) -> str:
        if self.file is not None and filename == self.file[0]:
            return self.file[1]
        if self.repo_id is not None:
            from huggingface_hub import hf_hub_url

            return hf_hub_url(self.repo_id, filename, revision=self.commit or self.revision, endpoint=self.endpoint)
        return urljoin(self.base or "", quote(filename))

    @property
    def where(self) -> str:
        """Where the files are, as shown and stored (secrets redacted)."""
        if self.repo_id is not None:
            return redact_url(f"{self.endpoint}/{self.repo_id}@{self.revision}")
        return redact_url(self.base or self.label)

    def headers(self, url: str) -> dict[str, str]:
        """huggingface_hub's headers for a request to ``url``; its token only over https to the Hub
        endpoint's exact scheme, host and port (:func:`sends_token`)."""
        from huggingface_hub.utils import build_hf_headers

        h = build_hf_headers(token=None if sends_token(url, self.endpoint or endpoint()) else False)
        h["Accept-Encoding"] = "identity"  # byte counts and ranges of the stored file, never of a re-encoding
        return h


@contextmanager
def redacted():
    """Every HeadRankError raised inside, with the URLs in its message redacted."""
    try:
        yield
    except HeadRankError as e:
        text = redact_text(str(e))
        if text == str(e):
            raise
        raise type(e)(text) from None


def _retrying(fn, transfer: Transfer, what: str, url: str):
    """``fn()`` with :data:`RETRIES` more tries on :class:`_Retry`, then one line."""
    for attempt in range(RETRIES + 1):
        try:
            return fn()
        except _Retry as e:
            last = e
            if attempt < RETRIES:
                transfer.count("retries")
                time.sleep(BACKOFF_S * 2 ** attempt)
    raise HeadRankError(f"cannot read {what} from {url}: {last} ({RETRIES + 1} tries)")


class RemoteFile:
    """One file on a server, read by byte ranges (``read``) or whole (``read_all``, small files)."""

    def __init__(self, loc: Location, name: str, transfer: Transfer, *, allow_full: bool = False,
                 what: str | None = None):
        self.loc, self.name, self.transfer, self.allow_full = loc, name, transfer, allow_full
        self.what = what or name  # how errors name it
        self.size: int | None = None
        self.max_full: int | None = None  # allow_full: the most a whole file may hold (None: :meth:`_most`)
        self.attention: Any = None  # name -> whether the analysis reads that tensor (None: not known)
        self._full: Any = None  # the temporary file of a server that ignores Range (allow_full)
        self._full_lock = threading.Lock()

    @property
    def url(self) -> str:
        return self.loc.url(self.name)

    def read(self, start: int, end: int, kind: str = "tensor", *, clip: bool = False) -> bytearray:
        """Bytes ``[start, end)``; ``clip``: a file shorter than ``end`` gives what it has."""
        if self.size is not None:
            if end > self.size and not clip:
                raise HeadRankError(f"{self.url}: bytes {start}-{end - 1} lie outside the file ({self.size:,} bytes)")
            end = min(end, self.size)
        if end <= start:
            return bytearray()
        if self._full is not None:
            self.transfer.local(end - start, kind)
            if isinstance(self._full, _Prefix):
                return self._full.read(start, end, self)
            return bytearray(os.pread(self._full.fileno(), end - start, start))
        what = f"bytes {start}-{end - 1} of {self.name}"
        return _retrying(lambda: self._try_range(start, end, kind, clip), self.transfer, what, self.url)

    def _try_range(self, start: int, end: int, kind: str, clip: bool) -> bytearray:
        url = self.url
        headers = {**self.loc.headers(url), "Range": f"bytes={start}-{end - 1}"}
        clock = _Clock(url, end - start)
        with _http_errors(self.loc, url, self.what):
            self.transfer.count("requests")
            with stream(url, headers, clock) as r:
                if r.status_code == 416:
                    raise HeadRankError(f"{url}: bytes {start}-{end - 1} lie outside the file (HTTP 416)")
                _check_status(r)
                if r.status_code == 200:
                    return self._whole(r, start, end, kind, clock)
                if r.status_code != 206:
                    raise HeadRankError(f"{url}: HTTP {r.status_code} to a range request (expected 206)")
                got = _content_range(r.headers.get("Content-Range"))
                if got is None or got[0] != start or not (got[1] == end - 1 or (clip and got[1] < end - 1)):
                    raise HeadRankError(f"{url}: asked for bytes {start}-{end - 1}, the server answered "
                                        f"{r.headers.get('Content-Range')!r}")
                self._learn_size(got[2])
                return self._body(r, got[1] + 1 - start, kind, clock)

    def _body(self, r, n: int, kind: str, clock: _Clock) -> bytearray:
        buf, got = bytearray(n), 0
        try:
            for chunk in r.iter_bytes():
                if got + len(chunk) > n:
                    raise HeadRankError(f"{self.url}: the server sent more than the {n:,} bytes asked for")
                buf[got:got + len(chunk)] = chunk
                got += len(chunk)
                clock.check(got)
        finally:
            self.transfer.add(got, kind)
        if got != n:
            raise _Retry(f"response truncated: {got:,} of {n:,} bytes")
        return buf

    def _learn_size(self, total: int | None) -> None:
        if total is not None and self.size is None:
            self.size = total

    def _whole(self, r, start: int, end: int, kind: str, clock: _Clock) -> bytearray:
        """A 200 to a range request: the server sends the whole file. Refused unless allow_full;
        then refused before any byte is written when its Content-Length exceeds the most a whole
        file may hold (:meth:`_most`), and stopped when a body without one runs past it. A
        safetensors file that holds no attention tensor keeps its header only."""
        total = r.headers.get("Content-Length")
        size = int(total) if total and total.isdigit() else None
        if not self.allow_full:
            raise HeadRankError(
                f"{urlsplit(self.url).hostname} ignores HTTP range requests (answered 200 with the whole "
                f"{self.name}, {_mb(size) if size is not None else 'size unknown'}): reading only "
                "the attention tensors is impossible there; pass `allow_full` to download whole files instead")
        with self._full_lock:
            if self._full is not None:  # another thread downloaded it meanwhile
                return self.read(start, end, kind)
            clock.nbytes = size  # the deadline of the whole file (of the bytes received, size unknown)
            chunks = iter(r.iter_bytes())
            head, most, why = self._most(chunks, size, clock)
            if most == 0 and size is not None and head is not None:  # nothing to read beyond the header
                self._full, self.size = _Prefix(bytes(head)), size
                self.transfer.whole_file(self.name)
                return self.read(start, end, kind)
            if size is not None and size > most:
                raise HeadRankError(f"{redact_url(self.url)} ignores HTTP range requests and its whole {self.name} is "
                                    f"{size:,} bytes, more than {why} ({most:,} bytes): refusing to download it; give "
                                    f"`max_bytes` of at least {size:,} to read it whole")
            self._full = self._download(head or b"", chunks, size, most, clock)
            self.size = os.fstat(self._full.fileno()).st_size
            self.transfer.whole_file(self.name)
        return self.read(start, end, kind)

    def _most(self, chunks, size: int | None, clock: _Clock) -> tuple[bytearray | None, int, str]:
        """(the bytes read ahead, the most the whole file may hold, what sets it): ``max_bytes``
        as given; else twice the attention tensors' bytes that the safetensors header at the
        file's start lists (read ahead from ``chunks``, checked as a ranged header is); else
        :data:`MAX_FULL_BYTES` (not a safetensors file, a model type without a layout, no size)."""
        if self.max_full is not None:
            return None, self.max_full, "`max_bytes`"
        unknown = None, MAX_FULL_BYTES, "the default `max_bytes`"
        if self.attention is None or size is None or not self.name.endswith(".safetensors"):
            return unknown
        head, need = bytearray(), 8
        for chunk in chunks:
            head += chunk
            self.transfer.add(len(chunk), "full")
            clock.check(len(head))
            if len(head) >= 8:
                need = 8 + _header_length(bytes(head[:8]), size, redact_url(self.url))
            if len(head) >= need:
                break
        entries = _header_entries(bytes(head[:need]), size, redact_url(self.url))
        promised = sum(e - b for name, (_, _, b, e) in entries.items() if self.attention(name))
        return head, 2 * promised, (f"twice the {promised:,} bytes of attention tensors its header lists (the "
                                    "default `max_bytes`)")

    def _download(self, head: bytes, chunks, size: int | None, most: int, clock: _Clock) -> Any:
        """The whole file (``head``, then the rest of ``chunks``) in a temporary file deleted on close."""
        tmp = tempfile.TemporaryFile(prefix=f"{TMP_PREFIX}{os.getpid()}-full-")  # unlinked at once
        n, cap = len(head), size if size is not None else most
        try:
            tmp.write(head)
            for chunk in chunks:
                n += len(chunk)
                self.transfer.add(len(chunk), "full")
                if n > cap:
                    raise HeadRankError(f"{redact_url(self.url)}: the server sent more than {_mb(cap)} for "
                                        f"{self.name}")
                tmp.write(chunk)
                clock.check(n)
            if size is not None and n != size:
                raise _Retry(f"response truncated: {n:,} of {size:,} bytes")
            tmp.flush()
        except BaseException:
            tmp.close()
            raise
        return tmp

    def read_all(self, kind: str = "metadata", *, missing_ok: bool = False, what: str = "config") -> bytes | None:
        """The whole (small) file, at most :data:`headrank.io.validate.JSON_CAPS` of ``what``;
        ``missing_ok``: None for a 404."""
        cap = JSON_CAPS.get(what, MAX_JSON_BYTES)

        def once() -> bytes | None:
            url = self.url
            clock = _Clock(url)
            with _http_errors(self.loc, url, self.what):
                self.transfer.count("requests")
                with stream(url, self.loc.headers(url), clock) as r:
                    if r.status_code == 404 and missing_ok:
                        return None
                    _check_status(r)
                    if r.headers.get("X-Repo-Commit") and self.loc.repo_id and not self.loc.commit:
                        self.loc.commit = r.headers["X-Repo-Commit"]
                    declared = r.headers.get("Content-Length")
                    if declared and declared.isdigit() and int(declared) > cap:
                        raise HeadRankError(f"{redact_url(url)}: {self.name} is {_mb(int(declared))}, more than a "
                                            f"{what} may be ({_mb(cap)})")
                    if declared and declared.isdigit():
                        clock.nbytes = int(declared)
                        return bytes(self._body(r, int(declared), kind, clock))
                    return self._unsized(r, kind, cap, clock, what)

        return _retrying(once, self.transfer, self.name, self.url)

    def _unsized(self, r, kind: str, cap: int, clock: _Clock, what: str) -> bytes:
        parts, n = [], 0
        try:
            for chunk in r.iter_bytes():
                parts.append(chunk)
                n += len(chunk)
                if n > cap:
                    raise HeadRankError(f"{redact_url(self.url)}: {self.name} is larger than a {what} may be "
                                        f"({_mb(cap)})")
                clock.check(n)
        finally:
            self.transfer.add(n, kind)
        return b"".join(parts)

    def close(self) -> None:
        if self._full is not None:
            self._full.close()
            self._full = None


def _json(data: bytes, what: str, url: str) -> Any:
    """``data`` parsed as a ``what`` (its byte cap and memory budget checked first)."""
    return upgrade(parse_json(data, what, redact_url(url)))


@dataclass(frozen=True)
class _At:
    """Where one tensor lies in its file."""

    file: RemoteFile
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


class _Prefix:
    """The start of a file whose header lists no attention tensor, kept instead of the whole file."""

    def __init__(self, data: bytes):
        self.data = data

    def read(self, start: int, end: int, f: RemoteFile) -> bytearray:
        if end > len(self.data):
            raise HeadRankError(f"{redact_url(f.url)}: {f.name} holds no attention tensor, so only its header was "
                                f"downloaded (the default `max_bytes`); bytes {start}-{end - 1} lie beyond it: pass "
                                "`max_bytes` to download it whole")
        return bytearray(self.data[start:end])

    def close(self) -> None:
        self.data = b""


def _header_length(head: bytes, size: int, shown: str) -> int:
    """The header length that a safetensors file of ``size`` bytes states in its first 8 bytes."""
    if len(head) < 8:
        raise HeadRankError(f"{shown}: not a safetensors file ({len(head)} bytes)")
    n = int.from_bytes(head[:8], "little")
    if n > size - 8:
        raise HeadRankError(f"{shown}: corrupt safetensors header: it claims {n:,} bytes but the file holds "
                            f"{size:,}")
    if n > MAX_HEADER:
        raise HeadRankError(f"{shown}: a safetensors header of {n:,} bytes exceeds the {MAX_HEADER >> 20} MiB a "
                            "header may have")
    return n


def _header_entries(raw: bytes, size: int, shown: str) -> dict[str, tuple[str, tuple[int, ...], int, int]]:
    """The entries of the safetensors header that starts ``raw`` (8 length bytes, then the JSON),
    checked as a local file's are (:func:`headrank.io.validate.safetensors_entries`: dtype,
    shape, span, inside the file of ``size`` bytes, no overlaps); offsets from the data start."""
    n = _header_length(raw, size, shown)
    if len(raw) < 8 + n:
        raise HeadRankError(f"{shown}: the file ends inside its safetensors header ({len(raw) - 8:,} of {n:,} bytes)")
    header = parse_json(raw[8:8 + n], "safetensors header", shown)
    return safetensors_entries(header, size - 8 - n, shown)


def read_safetensors_header(f: RemoteFile) -> dict[str, _At]:
    """Two ranged GETs: the 8-byte length, then the JSON header (:func:`_header_entries`)."""
    head = bytes(f.read(0, 8, "metadata", clip=True))
    shown, size = redact_url(f.url), f.size or 0
    n = _header_length(head, size, shown)
    entries = _header_entries(head + bytes(f.read(8, 8 + n, "metadata")), size, shown)
    return {name: _At(f, dtype, shape, 8 + n + b, 8 + n + end) for name, (dtype, shape, b, end) in entries.items()}


class RemoteCheckpoint(BaseCheckpoint):
    """A checkpoint whose config, index and safetensors headers were fetched over HTTP;
    ``get`` fetches one tensor with one ranged GET."""

    def __init__(self, loc: Location, transfer: Transfer, *, weights: str | None = None,
                 config: dict[str, Any] | None = None, allow_full: bool = False, max_full: int | None = None):
        self.loc, self.transfer, self.allow_full = loc, transfer, allow_full
        self._declared_size: int | None = None
        cfg_file = RemoteFile(loc, "config.json", transfer, what="config.json (for a GGUF file, pass its URL: "
                              ".../resolve/REVISION/FILE.gguf on the Hub)" if loc.repo_id else None)
        if config is None:
            config = _json(cfg_file.read_all(what="config") or b"", "config", cfg_file.url)
            if not isinstance(config, dict):
                raise HeadRankError(f"{cfg_file.url} is not a JSON object")
        weight_map = None if weights else self._weight_map()
        self.weight_names = [weights] if weights else sorted(set(weight_map.values())) if weight_map else \
            ["model.safetensors"]
        hint = None if weights or weight_map else (
            "model.safetensors (reading remotely needs safetensors weights, model.safetensors or "
            "model.safetensors.index.json, or the URL of a .gguf file)")
        self._files = {n: RemoteFile(loc, n, transfer, allow_full=allow_full, what=hint) for n in self.weight_names}
        reads = _attention_names(config)
        for f in self._files.values():
            f.max_full, f.attention = max_full, reads
        self._headers: dict[str, dict[str, _At]] = {}
        self._header_locks = {n: threading.Lock() for n in self._files}
        tensors: dict[str, _At | str] = {}
        if weight_map:  # the index decides which shard holds a tensor; a shard's header is fetched when one of
            tensors.update(weight_map)  # its tensors is first needed, so a shard the analysis skips costs nothing
            if self._declared_size is not None:
                transfer.declared(self._declared_size)
        else:
            with ThreadPoolExecutor(min(HEADER_THREADS, len(self._files))) as pool:
                for header in pool.map(self._header, self._files):
                    for t, at in header.items():
                        tensors.setdefault(t, at)
        super().__init__(tensors, source=loc.label, path=loc.where, config=config,
                         config_path=redact_url(cfg_file.url))

    def _header(self, shard: str) -> dict[str, _At]:
        """The safetensors header of weight file ``shard``, fetched once (two ranged GETs)."""
        with self._header_locks[shard]:
            if shard not in self._headers:
                f = self._files[shard]
                self._headers[shard] = read_safetensors_header(f)
                self.transfer.weight_file(shard, f.size or 0)
        return self._headers[shard]

    def _entry(self, name: str) -> _At:
        at = super()._entry(name)
        if isinstance(at, str):  # a shard named by the index whose header has not been fetched yet
            header = self._header(at)
            if name not in header:
                raise HeadRankError(f"shard {at} lacks tensors its index names, e.g. {name}")
            at = self._entries[name] = header[name]
        return at

    def _weight_map(self) -> dict[str, str] | None:
        """The shard index's ``weight_map`` (tensor -> shard file), None without an index."""
        index_name = HF_WEIGHTS[0]  # model.safetensors.index.json
        idx_file = RemoteFile(self.loc, index_name, self.transfer)
        raw = idx_file.read_all(missing_ok=True, what="shard index")
        if raw is None:
            return None
        data = _json(raw, "shard index", idx_file.url)
        total = data.get("metadata", {}).get("total_size") if isinstance(data, dict) and isinstance(
            data.get("metadata"), dict) else None
        self._declared_size = total if isinstance(total, int) and not isinstance(total, bool) and total > 0 else None
        wm = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(wm, dict) or not wm or not all(isinstance(v, str) for v in wm.values()):
            raise HeadRankError(f"corrupt shard index {idx_file.url}: its weight_map must be a non-empty object "
                                "(tensor name -> shard file)")
        for shard in set(wm.values()):
            if shard.startswith("/") or ".." in Path(shard).parts or "://" in shard or not shard.strip():
                raise HeadRankError(f"shard index {idx_file.url} names a file outside the checkpoint: {shard!r}")
        return wm

    def _read(self, name: str, at: _At) -> torch.Tensor:
        """Fetch one tensor (one ranged GET) in its stored dtype."""
        if at.dtype not in ST_DTYPES:
            raise HeadRankError(f"{redact_url(at.file.url)}: tensor {name} has unsupported dtype {at.dtype!r}")
        with redacted():
            buf = at.file.read(at.start, at.end, "tensor")
        dtype = ST_DTYPES[at.dtype]
        if not buf:
            return torch.empty(at.shape, dtype=dtype)
        return torch.frombuffer(buf, dtype=dtype).reshape(at.shape)

    def _meta(self, name: str, at: _At) -> TensorMeta:
        dtype = dtype_name(ST_DTYPES[at.dtype]) if at.dtype in ST_DTYPES else at.dtype
        return TensorMeta(dtype, at.shape, at.end - at.start, at.file.name)

    def _read_stored(self, names: list[str]) -> dict[str, torch.Tensor]:
        """Several stored tensors (one layer's, with their quantization scales) fetched
        concurrently: one round trip of latency per layer instead of one per tensor."""
        if len(names) < 2:
            return {n: self._read(n, self._entry(n)) for n in names}
        with ThreadPoolExecutor(min(len(names), FETCH_THREADS), thread_name_prefix="headrank-fetch") as pool:
            futures = {n: pool.submit(self._read, n, self._entry(n)) for n in names}
            return {n: f.result() for n, f in futures.items()}

    @property
    def files(self) -> list[Any]:
        return list(self.weight_names)

    def close(self) -> None:
        for f in self._files.values():
            f.close()


def _attention_names(config: dict[str, Any]) -> Any:
    """``name -> bool``: whether a tensor is one that the analysis of a model of ``config`` reads
    (attention projections and biases of its layout, under any prefix); None for a model type
    without a layout in the table (then the default `max_bytes` is 4 GiB)."""
    import re

    from headrank.io.layouts import layout_for

    try:
        lay = layout_for(config)
    except HeadRankError:
        return None
    names = {*lay.tensors.values(), *lay.biases, *(t for alt in lay.aliases for t in alt.values())}
    names |= {t.replace(".weight", ".bias") for alt in lay.aliases for t in alt.values()}
    pattern = re.compile("(?:.*\\.)?(?:" + "|".join(re.escape(t).replace(re.escape("{i}"), r"\d+")
                                                      for t in sorted(names)) + ")")
    return lambda name: pattern.fullmatch(name) is not None


def _gguf_class():
    from headrank.io.gguf import GGUFCheckpoint

    class RemoteGGUFCheckpoint(GGUFCheckpoint):
        """A GGUF file on a server: its header parsed by ``gguf.GGUFReader`` from the fetched
        header bytes (in a sparse temporary file, deleted at once), each tensor fetched with
        one ranged GET and dequantized as a local file's would be."""

        def __init__(self, f: RemoteFile):
            self.remote = f
            tmp = _gguf_header_file(f)
            try:
                super().__init__(tmp, label=f.loc.label, where=redact_url(f.url))
                self._file.close()  # tensor data travels by range requests, never from the header copy
                self.stamps.discard(tmp)  # a temporary copy, not the checkpoint (the server's answers are checked)
            except HeadRankError as e:
                raise type(e)(str(e).replace(str(tmp), redact_url(f.url))) from None
            finally:
                os.unlink(tmp)
            f.transfer.weight_file(f.name, f.size or 0)

        def _tensor_data(self, t: Any) -> np.ndarray:
            with redacted():
                buf = self.remote.read(t.data_offset, t.data_offset + t.n_bytes, "tensor")
            return np.frombuffer(buf, dtype=t.data.dtype).reshape(t.data.shape)

        @property
        def files(self) -> list[Any]:
            return [self.remote.name]

        def close(self) -> None:
            super().close()
            self.remote.close()

    return RemoteGGUFCheckpoint


def _gguf_header_file(f: RemoteFile) -> str:
    """A sparse temporary file of the remote file's size holding only its header bytes, fetched
    in growing chunks until the header (checked by :func:`headrank.io.gguf_header.check_structure`,
    bounded by what was fetched) ends inside them."""
    from headrank.io import gguf_header as ag

    sweep_temp()
    magic = f.read(0, 4, "metadata", clip=True)
    if bytes(magic) != b"GGUF":
        raise HeadRankError(f"{redact_url(f.url)}: not a GGUF file (it does not start with the GGUF magic)")
    size, most = f.size or 4, ag.MAX_GGUF_HEADER
    fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{os.getpid()}-gguf-", suffix=".gguf")
    fetched, chunk = 4, GGUF_FIRST_CHUNK
    try:
        os.pwrite(fd, bytes(magic), 0)
        while True:
            want = min(size, max(chunk, fetched), most)
            if want > fetched:
                os.pwrite(fd, bytes(f.read(fetched, want, "metadata")), fetched)
                fetched = want
            try:
                _header_complete(ag, tmp, fetched)
                os.ftruncate(fd, size)  # tensor data: a hole, never read
                return tmp
            except ag.TooLarge as e:  # beyond the caps: no more bytes would help
                raise ag.TooLarge(str(e).replace(tmp, redact_url(f.url))) from None
            except HeadRankError as e:
                if fetched >= min(size, most):
                    raise HeadRankError(str(e).replace(tmp, redact_url(f.url))) from None
            chunk *= 4
    except BaseException:
        os.unlink(tmp)
        raise
    finally:
        os.close(fd)


def _header_complete(ag: Any, tmp: str, fetched: int) -> None:
    """Raise unless the GGUF header lies entirely within the ``fetched`` bytes of ``tmp``."""
    check = getattr(ag, "check_structure", None)
    if check is not None:
        check(Path(tmp))  # walks magic, metadata and tensor infos within the file's bytes
        return
    from gguf import GGUFReader

    try:
        end = GGUFReader(tmp).data_offset
    except Exception as e:  # noqa: BLE001 - cut short or corrupt
        raise HeadRankError(f"cannot read GGUF file {tmp}: {one_line(e, 200)}") from None
    if end > fetched:
        raise HeadRankError(f"cannot read GGUF file {tmp}: its header runs past byte {fetched:,}")


def _location(source: str, revision: str | None) -> tuple[Location, str | None]:
    """The files' location and, for a URL of one file, that file's name."""
    from headrank.io import hub

    if is_url(source):
        if revision is not None:
            raise HeadRankError("`revision` applies to a Hugging Face Hub id, not to a URL")
        try:
            parts = urlsplit(source)
            parts.port  # noqa: B018 - raises ValueError for a port that is not a number
        except ValueError as e:
            raise HeadRankError(f"not a URL that can be read: {redact_url(source)} ({one_line(e, 80)})") from None
        if not parts.netloc or not parts.hostname:
            raise HeadRankError(f"not a URL that can be read: {redact_url(source)}")
        name = unquote(parts.path.rsplit("/", 1)[-1])
        label = redact_url(source)
        if name.endswith((".gguf", ".safetensors")):
            return Location(label, base=urljoin(source, "."), file=(name, source)), name
        return Location(label, base=source if source.endswith("/") else source + "/"), None
    if not hub.looks_like_repo_id(source):
        raise HeadRankError(f"`remote` reads a Hugging Face Hub id (org/name) or an http(s) URL; got {source!r}")
    return Location(source, repo_id=source, revision=revision or "main", endpoint=endpoint()), None


def open_remote(source: str, *, revision: str | None = None, allow_full: bool | int = False,
                config: str | os.PathLike | dict[str, Any] | None = None) -> tuple[BaseCheckpoint, dict[str, Any], Any]:
    """``(checkpoint, origin, layout)`` of a Hub id or URL read over HTTP (module docstring);
    ``layout`` is the GGUF file's own, else None. ``origin['remote']`` is the live
    :attr:`Transfer.stats`, complete once the analysis has read its layers. ``allow_full``: True,
    or the most bytes one whole file may hold (``--max-bytes``; True: twice the attention bytes each
    safetensors header lists, else :data:`MAX_FULL_BYTES`).
    Every URL in ``origin`` and in the messages is redacted (:mod:`headrank.util.redact`)."""
    from headrank.io import hub

    if hub.offline():
        raise HeadRankError("reading remotely needs the network, but HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is "
                            "set: unset it")
    with redacted():
        return _open_remote(source, revision, allow_full, config)


def _open_remote(source: str, revision: str | None, allow_full: bool | int, config: Any) -> tuple[Any, Any, Any]:
    loc, name = _location(source, revision)
    transfer = Transfer(redact_url(loc.url(name)) if name is not None and loc.repo_id is None else loc.where)
    if isinstance(config, (str, os.PathLike)):
        from headrank.io.checkpoint import read_config

        config = read_config(Path(config))
    most = None if allow_full is True or not allow_full else int(allow_full)  # None: RemoteFile._most
    if most is not None and most < 1:
        raise HeadRankError(f"`max_bytes` must be a positive number of bytes; got {most}")
    origin: dict[str, Any] = {"input": "remote", "source": redact_url(source), "path": loc.where}
    if name is not None and name.endswith(".gguf"):
        from headrank.io.gguf import gguf_origin

        f = RemoteFile(loc, name, transfer, allow_full=bool(allow_full))
        f.max_full = most
        ckpt = _gguf_class()(f)
        origin.update(gguf_origin(ckpt), input="remote")
        layout = ckpt.layout
    else:
        ckpt = RemoteCheckpoint(loc, transfer, weights=name, config=config, allow_full=bool(allow_full),
                                max_full=most)
        layout = None
    origin["path"] = redact_url(loc.url(name) if name else loc.url(""))  # the Hub's: .../resolve/COMMIT/
    origin["files"] = list(ckpt.files)
    if loc.repo_id is not None:
        origin["hub"] = {"repo_id": loc.repo_id, "revision": loc.revision, "commit": loc.commit,
                         "endpoint": redact_url(loc.endpoint)}
    if ckpt.quantization is not None:  # the scheme layer (io.schemes): what was dequantized
        origin["quantization"] = ckpt.quantization
    origin["remote"] = transfer.stats
    return ckpt, origin, layout


def list_revisions(repo_id: str) -> list[str]:
    """Every branch and tag of a Hub repo (the refs API that ``HfApi.list_repo_refs`` calls, read
    here within the byte cap and memory budget of a ``list of refs``), one line on failure."""
    from headrank.io import hub

    if hub.offline():
        raise HeadRankError("`revisions` all lists the Hub's refs, but HF_HUB_OFFLINE is set (unset it)")
    if not hub.looks_like_repo_id(repo_id):
        raise HeadRankError(f"`revisions` all needs a Hugging Face Hub id (org/name); got {repo_id!r}")
    ep = endpoint()
    url = f"{ep}/api/models/{repo_id}/refs"
    loc = Location(repo_id, repo_id=repo_id, revision="main", endpoint=ep, file=("refs", url))
    with redacted():
        raw = RemoteFile(loc, "refs", Transfer(redact_url(url)), what="the list of refs").read_all(what="list of refs")
        data = _json(raw or b"", "list of refs", url)
    names = []
    for kind in ("branches", "tags"):
        refs = data.get(kind) if isinstance(data, dict) else None
        if not isinstance(refs, list) or not all(isinstance(r, dict) and isinstance(r.get("name"), str) for r in refs):
            raise HeadRankError(f"{redact_url(url)}: the list of refs has no list of {kind} with names")
        names += [r["name"] for r in refs]
    return names
