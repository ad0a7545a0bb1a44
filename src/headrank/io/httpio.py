"""HTTP plumbing of :mod:`headrank.io.remote`: the endpoint, timeouts and the total deadline of
a request, what travelled (:class:`Transfer`), when the Hub token may go with a request
(:func:`sends_token`: only over https to the endpoint's exact scheme, host and port), and the
sweep of temporary files a killed run left (docs/remote-security.md)."""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from headrank.errors import HeadRankError
from headrank.util.redact import redact_url

MIN_RATE = 64 << 10  # bytes/s: a request may take DEADLINE_READS read timeouts plus its bytes at this rate
DEADLINE_READS = 3
TMP_PREFIX = "headrank-remote-"  # temporary files: headrank-remote-PID-...; a later run sweeps a dead PID's


def endpoint() -> str:
    """The Hub endpoint as the environment names it now (``HF_ENDPOINT``)."""
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def timeout_s() -> float:
    """Seconds to wait for a server to send data (``HF_HUB_DOWNLOAD_TIMEOUT``, default 10)."""
    try:
        return max(float(os.environ.get("HF_HUB_DOWNLOAD_TIMEOUT") or 10), 0.1)
    except ValueError:
        return 10.0


def deadline_s(nbytes: int = 0) -> float:
    """The total time one request may take, besides the read timeout between bytes: a server that
    drips one byte a second never times out a read, but it does end here."""
    return DEADLINE_READS * timeout_s() + nbytes / MIN_RATE


class _Clock:
    """The deadline of one request (:func:`deadline_s` of the bytes expected; of the bytes
    received so far when the size is unknown), checked as bytes arrive."""

    def __init__(self, url: str, nbytes: int | None = None):
        self.url, self.nbytes, self.start = url, nbytes, time.monotonic()

    def check(self, got: int) -> None:
        took, limit = time.monotonic() - self.start, deadline_s(self.nbytes if self.nbytes is not None else got)
        if took > limit:
            raise HeadRankError(f"{redact_url(self.url)}: the server is too slow: {got:,} bytes in {took:.0f} s, "
                                f"more than a request may take (HF_HUB_DOWNLOAD_TIMEOUT={timeout_s():g} s per read)")


def _mb(n: int | None) -> str:
    return "?" if n is None else f"{n / 1e6:,.1f} MB" if n >= 1e5 else f"{n:,} bytes"


class Transfer:
    """What travelled: ``stats`` is the dict that ends in meta.json (updated as bytes arrive)."""

    def __init__(self, where: str):
        self._lock = threading.Lock()
        self.sizes: dict[str, int] = {}  # weight file -> size
        self.started = time.perf_counter()
        self.stats: dict[str, Any] = {
            "url": where, "protocol": "HTTP range requests, one per tensor; no weights written to disk",
            "bytes_fetched": 0, "tensor_bytes": 0, "metadata_bytes": 0, "full_bytes": 0, "requests": 0,
            "retries": 0, "checkpoint_bytes": None, "share": None, "full_downloads": [], "seconds": 0.0}

    def local(self, n: int, kind: str) -> None:
        """Bytes read from a whole file downloaded before (``allow_full``): counted as read, not fetched."""
        with self._lock:
            self.stats[f"{kind}_bytes"] += n

    def whole_file(self, name: str) -> None:
        """A server ignored range requests and sent ``name`` whole (``allow_full``): say so."""
        with self._lock:
            self.stats["full_downloads"].append(name)
            self.stats["protocol"] = ("whole files downloaded (the server ignores HTTP range requests; allow_full) "
                                      "into temporary files, deleted after reading; full_bytes: their size")

    def add(self, n: int, kind: str) -> None:
        with self._lock:
            s = self.stats
            s["bytes_fetched"] += n
            s[f"{kind}_bytes"] += n
            s["seconds"] = round(time.perf_counter() - self.started, 3)
            if s["checkpoint_bytes"]:
                s["share"] = s["bytes_fetched"] / s["checkpoint_bytes"]

    def count(self, what: str) -> None:
        with self._lock:
            self.stats[what] += 1

    def weight_file(self, name: str, size: int) -> None:
        with self._lock:
            self.sizes[name] = size
            self.stats["checkpoint_bytes"] = sum(self.sizes.values())
            self.stats["share"] = self.stats["bytes_fetched"] / max(self.stats["checkpoint_bytes"], 1)


def transfer_line(s: dict[str, Any]) -> str:
    """One line of :attr:`Transfer.stats` for the terminal."""
    share = f" ({100 * s['share']:.2f} %)" if s.get("share") is not None else ""
    full = f"; downloaded whole: {', '.join(s['full_downloads'])}" if s.get("full_downloads") else ""
    return (f"fetched {_mb(s['bytes_fetched'])} of a {_mb(s['checkpoint_bytes'])} checkpoint{share} in "
            f"{s['requests']} HTTP requests ({s['retries']} retried), {s['seconds']:.1f} s{full}")


def _origin(url: str) -> tuple[str, str, int | None]:
    try:
        p = urlsplit(url)
        port = p.port or {"https": 443, "http": 80}.get(p.scheme.lower())
    except ValueError:
        return ("", "", None)
    return p.scheme.lower(), (p.hostname or "").lower(), port


_warned: set[tuple[str, str, int | None]] = set()


def sends_token(url: str, hub: str) -> bool:
    """Whether the Hub token goes with a request to ``url``: only over https, and only to the
    endpoint ``hub``'s own scheme, host and port. A plain-http request to the endpoint's host
    goes without it, with one warning line on stderr (once per host) when a token is set."""
    mine, there = _origin(url), _origin(hub)
    if mine[0] == "https" and mine == there:
        return True
    if mine[0] == "http" and mine[1:] and mine[1] == there[1] and mine not in _warned:
        from huggingface_hub import get_token

        if get_token():
            _warned.add(mine)
            sys.stderr.write(f"warning: the Hugging Face token is not sent over plain http "
                             f"({mine[0]}://{mine[1]}:{mine[2]}); use an https endpoint to send it\n")
    return False


def sweep_temp(directory: str | None = None) -> list[str]:
    """Remove the temporary files a killed run left (``headrank-remote-PID-*`` of a process that is
    gone; header copies of older versions, ``headrank-gguf-header-*`` / ``attnrank-gguf-header-*``,
    an hour after they were written); the paths removed."""
    import glob

    where = directory or tempfile.gettempdir()
    gone = []
    for p in glob.glob(os.path.join(where, f"{TMP_PREFIX}*")):
        try:
            pid = int(os.path.basename(p)[len(TMP_PREFIX):].split("-", 1)[0])
        except ValueError:
            continue
        if pid != os.getpid() and not _alive(pid):
            gone.append(p)
    for pat in ("headrank-gguf-header-*", "attnrank-gguf-header-*"):
        for p in glob.glob(os.path.join(where, pat)):
            try:
                if time.time() - os.stat(p).st_mtime > 3600:
                    gone.append(p)
            except OSError:
                continue
    for p in gone:
        try:
            os.unlink(p)
        except OSError:
            pass
    return gone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True
