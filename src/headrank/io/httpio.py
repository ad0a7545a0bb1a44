"""HTTP plumbing of :mod:`headrank.io.remote`: the endpoint, timeouts and the total deadline of
a request (:func:`stream`: every socket operation of a request, from the connection to the last
byte, ends at its deadline), the client (:func:`session`), the HTTP layer's errors as one line,
what travelled (:class:`Transfer`), when the Hub token may go with a request
(:func:`sends_token`: only over https to the endpoint's exact scheme, host and port), and the
sweep of temporary files a killed run left (docs/remote-security.md)."""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from headrank.errors import HeadRankError, one_line
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
    received so far when the size is unknown). Every socket operation of the request, from the
    connection to the last byte of the body (the status line and headers included), waits at
    most until it (:func:`stream`); :meth:`check` also checks it as body bytes arrive."""

    def __init__(self, url: str, nbytes: int | None = None):
        self.url, self.nbytes, self.start, self.got = url, nbytes, time.monotonic(), 0

    def left(self) -> float:
        """Seconds left before the deadline (negative: past it)."""
        limit = deadline_s(self.nbytes if self.nbytes is not None else self.got)
        return self.start + limit - time.monotonic()

    def error(self) -> HeadRankError:
        took = time.monotonic() - self.start
        return HeadRankError(f"{redact_url(self.url)}: the server is too slow: {self.got:,} bytes in {took:.0f} s, "
                             f"more than a request may take (HF_HUB_DOWNLOAD_TIMEOUT={timeout_s():g} s per read)")

    def check(self, got: int) -> None:
        self.got = got
        if self.left() < 0:
            raise self.error()


_local = threading.local()  # .clock: the _Clock of the request this thread is making (stream())


def _bounded(timeout: float | None, expired: type[Exception]) -> float | None:
    """A socket operation's timeout cut to what is left of this thread's request deadline."""
    clock = getattr(_local, "clock", None)
    if clock is None:
        return timeout
    left = clock.left()
    if left <= 0:
        raise expired("the request's total deadline passed")
    return left if timeout is None else min(timeout, left)


def _backend() -> Any:
    """A network backend (httpcore2's public interface) whose every connect, read and write
    waits at most until the deadline of the request the calling thread makes: a server that
    drips its status line or headers a byte at a time ends there, as one that drips a body does."""
    import httpcore2

    class Stream(httpcore2.NetworkStream):
        def __init__(self, inner: Any):
            self._inner = inner

        def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            return self._inner.read(max_bytes, _bounded(timeout, httpcore2.ReadTimeout))

        def write(self, buffer: bytes, timeout: float | None = None) -> None:
            self._inner.write(buffer, _bounded(timeout, httpcore2.WriteTimeout))

        def close(self) -> None:
            self._inner.close()

        def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                      timeout: float | None = None) -> Any:
            return Stream(self._inner.start_tls(ssl_context, server_hostname,
                                                _bounded(timeout, httpcore2.ConnectTimeout)))

        def get_extra_info(self, info: str) -> Any:
            return self._inner.get_extra_info(info)

    class Backend(httpcore2.NetworkBackend):
        def __init__(self) -> None:
            self._inner = httpcore2.SyncBackend()

        def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                        socket_options: Any = None) -> Any:
            return Stream(self._inner.connect_tcp(host, port, _bounded(timeout, httpcore2.ConnectTimeout),
                                                  local_address, socket_options))

        def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options: Any = None) -> Any:
            return Stream(self._inner.connect_unix_socket(path, _bounded(timeout, httpcore2.ConnectTimeout),
                                                          socket_options))

        def sleep(self, seconds: float) -> None:
            self._inner.sleep(seconds)

    return Backend()


@contextmanager
def _mapped() -> Any:
    """httpcore2's exceptions as httpx2's of the same name (what callers catch)."""
    import httpx2

    try:
        yield
    except Exception as e:
        if not type(e).__module__.startswith("httpcore2"):
            raise
        raise getattr(httpx2, type(e).__name__, httpx2.TransportError)(str(e)) from e


def _transport() -> Any:
    """An httpx2 transport over an httpcore2 connection pool that uses :func:`_backend`."""
    import httpcore2
    import httpx2

    class Body(httpx2.SyncByteStream):
        def __init__(self, inner: Any):
            self._inner = inner

        def __iter__(self) -> Any:
            with _mapped():
                yield from self._inner

        def close(self) -> None:
            with _mapped():
                self._inner.close()

    class Transport(httpx2.BaseTransport):
        def __init__(self) -> None:
            self._pool = httpcore2.ConnectionPool(ssl_context=httpx2.create_ssl_context(), max_connections=100,
                                                  max_keepalive_connections=20, keepalive_expiry=5.0,
                                                  network_backend=_backend())

        def handle_request(self, request: Any) -> Any:
            url = httpcore2.URL(scheme=request.url.raw_scheme, host=request.url.raw_host, port=request.url.port,
                                target=request.url.raw_path)
            req = httpcore2.Request(method=request.method, url=url, headers=request.headers.raw,
                                    content=request.stream, extensions=request.extensions)
            with _mapped():
                resp = self._pool.handle_request(req)
            return httpx2.Response(status_code=resp.status, headers=resp.headers, stream=Body(resp.stream),
                                   extensions=resp.extensions)

        def close(self) -> None:
            self._pool.close()

    return Transport()


_session: tuple[tuple[Any, ...], Any] | None = None
_session_lock = threading.Lock()
_ENV = ("SSL_CERT_FILE", "SSL_CERT_DIR", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY",
        "http_proxy", "https_proxy", "all_proxy", "no_proxy")


def session() -> Any:
    """The HTTP client of remote reading: huggingface_hub's settings (redirects followed, no
    client-wide timeout), over :func:`_transport`, made anew in a forked process or when the
    certificate or proxy variables change. Where a proxy is set (``HTTP_PROXY``, ``HTTPS_PROXY``,
    ``ALL_PROXY``), httpx2's own transport goes through it (``NO_PROXY`` honoured): there the
    deadline is checked as body bytes arrive only."""
    import urllib.request

    import httpx2

    global _session
    key = (os.getpid(), *(os.environ.get(k) for k in _ENV))
    with _session_lock:
        if _session is None or _session[0] != key:
            old = _session
            proxied = any(urllib.request.getproxies().get(k) for k in ("http", "https", "all"))
            _session = (key, httpx2.Client(follow_redirects=True, timeout=None) if proxied else
                        httpx2.Client(transport=_transport(), follow_redirects=True, timeout=None))
            if old is not None and old[0][0] == os.getpid():
                old[1].close()
        return _session[1]


@contextmanager
def stream(url: str, headers: dict[str, str], clock: _Clock) -> Any:
    """A GET of ``url`` with its response streamed, every socket operation (connection, status
    line, headers, body; redirects followed) within ``clock``'s deadline besides the read
    timeout: past it, one line (:meth:`_Clock.error`)."""
    import httpx2

    before, _local.clock = getattr(_local, "clock", None), clock
    try:
        with session().stream("GET", url, headers=headers, timeout=timeout_s()) as r:
            yield r
    except httpx2.TimeoutException:
        if clock.left() <= 0:
            raise clock.error() from None
        raise
    finally:
        _local.clock = before


class _Retry(Exception):
    """A failure worth another try (connection dropped, timeout, short body, 5xx)."""


@contextmanager
def _http_errors(loc: Any, url: str, what: str):
    """Errors of the HTTP layer as one line each (``loc``: a :class:`headrank.io.remote.Location`);
    transient ones as :class:`_Retry`."""
    import httpx2
    from huggingface_hub import errors as hfe

    try:
        yield
    except HeadRankError:
        raise
    except hfe.OfflineModeIsEnabled:
        raise HeadRankError("reading remotely needs the network, but HF_HUB_OFFLINE is set (unset it)") from None
    except httpx2.TooManyRedirects:
        raise HeadRankError(f"redirect loop reading {what}: {url} redirects more than 20 times") from None
    except (httpx2.TimeoutException, httpx2.NetworkError, httpx2.RemoteProtocolError) as e:
        raise _Retry(one_line(e, 160, typed=True)) from None
    except (httpx2.InvalidURL, httpx2.UnsupportedProtocol) as e:
        raise HeadRankError(f"not a URL that can be read: {url} ({e})") from None
    except hfe.RevisionNotFoundError:
        raise HeadRankError(f"{loc.repo_id} has no revision {loc.revision!r} at {loc.endpoint}") from None
    except hfe.GatedRepoError:
        raise HeadRankError(f"{loc.repo_id} is gated: accept its terms on the Hub and set HF_TOKEN") from None
    except hfe.RepositoryNotFoundError as e:
        code = getattr(getattr(e, "response", None), "status_code", "?")
        raise HeadRankError(f"no repository {loc.repo_id} at {loc.endpoint} (HTTP {code}; a private one needs "
                            "HF_TOKEN)") from None
    except hfe.HfHubHTTPError as e:
        code = getattr(getattr(e, "response", None), "status_code", None)
        if code in (401, 403):
            raise HeadRankError(f"access refused (HTTP {code}) to {what}: {url} (set HF_TOKEN to a token "
                                "with access)") from None
        if code == 404 or isinstance(e, hfe.EntryNotFoundError):
            raise HeadRankError(f"not found (HTTP 404): {what} at {url}") from None
        if code is not None and (code >= 500 or code in (408, 429)):
            raise _Retry(f"HTTP {code}") from None
        raise HeadRankError(f"HTTP {code} reading {what}: {url}") from None


MAX_ERROR_BODY = 64 << 10  # bytes of an error answer read for its message (an endless one ends there)


def _check_status(r) -> None:
    """huggingface_hub's error for an answer of 400 or more, from its first :data:`MAX_ERROR_BODY` bytes."""
    if r.status_code >= 400:
        import httpx2
        from huggingface_hub.utils import hf_raise_for_status

        body = bytearray()
        for chunk in r.iter_bytes():
            body += chunk
            if len(body) >= MAX_ERROR_BODY:
                break
        hf_raise_for_status(httpx2.Response(r.status_code, headers=r.headers, content=bytes(body[:MAX_ERROR_BODY]),
                                            request=r.request))


def _content_range(value: str | None) -> tuple[int, int, int | None] | None:
    """``bytes a-b/total`` → (a, b, total or None)."""
    try:
        unit, rest = (value or "").split(" ", 1)
        span, total = rest.split("/", 1)
        a, b = span.split("-", 1)
        return int(a), int(b), None if total.strip() == "*" else int(total)
    except ValueError:
        return None


def _mb(n: int | None) -> str:
    return "?" if n is None else f"{n / 1e6:,.1f} MB" if n >= 1e5 else f"{n:,} bytes"


class Transfer:
    """What travelled: ``stats`` is the dict that ends in meta.json (updated as bytes arrive)."""

    def __init__(self, where: str):
        self._lock = threading.Lock()
        self.sizes: dict[str, int] = {}  # weight file -> size
        self.total: int | None = None  # the checkpoint's size as its shard index declares it (total_size)
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
            self.stats["checkpoint_bytes"] = self.total if self.total is not None else sum(self.sizes.values())
            self.stats["share"] = self.stats["bytes_fetched"] / max(self.stats["checkpoint_bytes"], 1)

    def declared(self, total: int) -> None:
        """A sharded checkpoint whose shards are read only where needed: its size is what the shard
        index declares (``metadata.total_size``, the tensors' bytes), not the sum of the shards seen."""
        with self._lock:
            self.total = total
            self.stats["checkpoint_bytes"] = total
            self.stats["share"] = self.stats["bytes_fetched"] / total


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
