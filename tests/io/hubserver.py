"""A Hub-like HTTP server on 127.0.0.1 for tests and benchmarks (no internet).

Serves checkpoints the caller wrote, laid out as the Hugging Face Hub lays them out:

- ``GET|HEAD /{org}/{name}/resolve/{revision}/{file}`` (revision: a branch name or the commit
  the server made up for it), with ``X-Repo-Commit``, ``ETag``, ``Accept-Ranges`` and single
  ``Range: bytes=a-b`` requests answered ``206`` + ``Content-Range`` (``416`` outside the file);
  weight files (``*.safetensors``, ``*.gguf``) are redirected (302) to ``/cdn/...`` as the Hub
  redirects LFS files to its CDN;
- ``GET /api/models/{org}/{name}/refs`` (what ``HfApi.list_repo_refs`` calls);
- ``GET|HEAD /files/{path}``: plain static files under ``root`` (a checkpoint directory served
  over HTTP without any Hub API);
- the Hub's error answers: ``404`` with ``X-Error-Code`` ``RepoNotFound`` / ``RevisionNotFound``
  / ``EntryNotFound``, ``401`` without or with a wrong token when ``token`` is set, ``403``
  ``GatedRepo`` for repos in ``gated``.

Faults, for the tests of bad servers: ``fault(path, start, end)`` may return ``"drop"`` (send
the headers and half the body, then close the connection), ``"norange"`` (ignore Range: 200
and the whole file), ``"short"`` (a 206 whose Content-Range and body are shorter than asked),
``"drip"`` (send the body one byte per ``drip_s`` seconds, bounded by ``drip_bytes``),
``"drip-full"`` (ignore Range and drip the whole file), ``"biglength"`` (ignore Range, and
state a Content-Length of 100 GB before the file's own bytes), or None. ``head_fault(path,
start, end)`` sees every request (redirects and the refs API included; ``start``, ``end``: the
Range asked for, -1 without one) and may return ``"drip-status"`` / ``"drip-headers"``: the
status line's reason phrase, or a header's value, one byte per ``drip_s`` seconds, so that the
answer never gets to its body; or ``"endless-error"``: a 500 whose body (no Content-Length)
runs on at full speed, up to 256 MiB. ``dripping``: the
``time.monotonic()`` when the last drip began; ``hung_up`` (an Event, ``hung_up_at``) is set
when a client closes a dripping connection.
``loop`` makes every resolve URL redirect to itself. ``bandwidth`` (bytes/s) limits all bodies
together. ``sent`` counts body bytes sent, ``log`` every request, ``auth`` the Authorization
header of every request (None when absent). ``move(repo, branch, directory)`` points a branch
at a new commit (the old commit keeps serving its files, as on the Hub); ``before_read`` is
called with (repo, revision, file) before a resolve answer (a test moves a branch there).
``tls`` (a :func:`self_signed` pair): serve https.
Use as a context manager; ``stop()`` shuts it down in bounded time (daemon threads, socket
timeouts).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

CHUNK = 64 * 1024


class HubServer:
    def __init__(self, root: Path | None = None, bandwidth: float | None = None,
                 tls: tuple[Path, Path] | None = None):
        self.root = root
        self.repos: dict[str, dict[str, Path]] = {}  # repo id -> {revision: directory}
        self.commits: dict[tuple[str, str], str] = {}  # (repo, branch) -> the commit it points at now
        self.trees: dict[tuple[str, str], Path] = {}  # (repo, commit) -> directory, every commit ever made
        self.auth: list[str | None] = []
        self.before_read: Callable[[str, str, str], None] | None = None
        self.drip_s, self.drip_bytes = 1.0, 1 << 20
        self.dripping: float | None = None
        self.hung_up, self.hung_up_at = threading.Event(), None
        self.token: str | None = None
        self.gated: set[str] = set()
        self.loop = False
        self.fault: Callable[[str, int, int], str | None] | None = None
        self.head_fault: Callable[[str, int, int], str | None] | None = None
        self.bandwidth = bandwidth
        self.sent = 0
        self.log: list[tuple[str, str, str | None]] = []
        self._lock = threading.Lock()
        self._next = time.perf_counter()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        self.httpd.handle_error = lambda request, client_address: None  # a client that hangs up: quiet
        self.scheme = "http"
        if tls is not None:
            import ssl

            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(str(tls[0]), str(tls[1]))
            self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
            self.scheme = "https"
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.httpd.server_address[1]}"

    def add(self, repo_id: str, revision: str, directory: Path) -> str:
        """Serve ``directory`` as ``repo_id`` at ``revision``; its made-up commit id."""
        self.repos.setdefault(repo_id, {})[revision] = Path(directory)
        sha = hashlib.sha1(f"{repo_id}@{revision}".encode()).hexdigest()
        self.commits[(repo_id, revision)] = sha
        self.trees[(repo_id, sha)] = Path(directory)
        return sha

    def move(self, repo_id: str, revision: str, directory: Path) -> str:
        """Point branch ``revision`` at a new commit holding ``directory``; the new commit id."""
        with self._lock:
            sha = hashlib.sha1(f"{repo_id}@{revision}:{len(self.trees)}:{directory}".encode()).hexdigest()
            self.repos[repo_id][revision] = Path(directory)
            self.commits[(repo_id, revision)] = sha
            self.trees[(repo_id, sha)] = Path(directory)
        return sha

    def reset(self) -> None:
        with self._lock:
            self.sent = 0
            self.log.clear()

    def start(self) -> HubServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- used by the handler -----------------------------------------------------------------
    def throttle(self, n: int) -> None:
        if not self.bandwidth:
            return
        with self._lock:
            now = time.perf_counter()
            self._next = max(self._next, now) + n / self.bandwidth
            wait = self._next - now - n / self.bandwidth
        if wait > 0:
            time.sleep(wait)

    def count(self, n: int) -> None:
        with self._lock:
            self.sent += n

    def revision_dir(self, repo_id: str, rev: str) -> Path | None:
        revs = self.repos.get(repo_id, {})
        if rev in revs:
            return revs[rev]
        return self.trees.get((repo_id, rev))


_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_CDN = re.compile(r"^/cdn/(?P<repo>[^/]+/[^/]+)/(?P<rev>[^/]+)/(?P<file>.+)$")
_REFS = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/refs$")


def _handler(server: HubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 10  # an idle keep-alive connection ends its thread

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def do_HEAD(self) -> None:  # noqa: N802
            self._serve(body=False)

        def do_GET(self) -> None:  # noqa: N802
            self._serve(body=True)

        # -- routing ---------------------------------------------------------------------
        def _serve(self, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            server.log.append((self.command, path, self.headers.get("Range")))
            server.auth.append(self.headers.get("Authorization"))
            asked = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range") or "")
            early = server.head_fault(path, *(int(asked[1]), int(asked[2]) + 1) if asked else (-1, -1)) \
                if server.head_fault is not None else None
            if early in ("drip-status", "drip-headers"):
                return self._drip_head(early)
            if early == "endless-error":
                return self._endless_error()
            if m := _REFS.match(path):
                return self._refs(m["repo"])
            if path.startswith("/files/") and server.root is not None:
                f = (server.root / path[len("/files/"):]).resolve()
                if not f.is_relative_to(server.root.resolve()) or not f.is_file():
                    return self._error(404, None)
                return self._file(f, body, path)
            m = _RESOLVE.match(path) or _CDN.match(path)
            if not m:
                return self._error(404, None)
            repo, rev, name = m["repo"], m["rev"], m["file"]
            if not self._authorised(repo):
                return None
            if server.before_read is not None:
                server.before_read(repo, rev, name)
            if server.loop:
                return self._redirect(self.path)
            d = server.revision_dir(repo, rev)
            if d is None:
                return self._error(404, "RevisionNotFound")
            f = (d / name).resolve()
            if not f.is_relative_to(d.resolve()) or not f.is_file():
                return self._error(404, "EntryNotFound")
            sha = server.commits.get((repo, rev), rev)  # a branch: its commit now; a commit: itself
            extra = {"X-Repo-Commit": sha, "ETag": f'"{_etag(f)}"'}
            if path.startswith("/cdn/") or not name.endswith((".safetensors", ".gguf")):
                return self._file(f, body, path, extra)
            sha = extra["X-Repo-Commit"]
            return self._redirect(f"/cdn/{repo}/{sha}/{name}", {**extra, "X-Linked-Size": str(f.stat().st_size)})

        def _authorised(self, repo: str) -> bool:
            if repo not in server.repos:
                self._error(404, "RepoNotFound")
                return False
            if server.token is not None and self.headers.get("Authorization") != f"Bearer {server.token}":
                given = self.headers.get("Authorization") is not None
                self._error(401, None if given else "RepoNotFound",
                            "Invalid credentials in Authorization header" if given else None)
                return False
            if repo in server.gated:
                self._error(403, "GatedRepo")
                return False
            return True

        def _refs(self, repo: str) -> None:
            if not self._authorised(repo):
                return
            branches = [{"name": rev, "ref": f"refs/heads/{rev}", "targetCommit": server.commits[(repo, rev)]}
                        for rev in server.repos[repo]]
            data = json.dumps({"branches": branches, "tags": [], "converts": []}).encode()
            self._send(200, {"Content-Type": "application/json", "Content-Length": str(len(data))}, data)

        # -- answers ---------------------------------------------------------------------
        def _error(self, code: int, error_code: str | None, message: str | None = None) -> None:
            data = json.dumps({"error": error_code or message or "not found"}).encode()
            headers = {"Content-Type": "application/json", "Content-Length": str(len(data))}
            if error_code:
                headers["X-Error-Code"] = error_code
            if message:
                headers["X-Error-Message"] = message
            self._send(code, headers, data)

        def _redirect(self, location: str, extra: dict[str, str] | None = None) -> None:
            self._send(302, {"Location": location, "Content-Length": "0", **(extra or {})}, b"")

        def _send(self, code: int, headers: dict[str, str], data: bytes) -> None:
            self.send_response(code)
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD" and data:
                self.wfile.write(data)
                server.count(len(data))

        def _file(self, f: Path, body: bool, path: str, extra: dict[str, str] | None = None) -> None:
            size = f.stat().st_size
            headers = {"Accept-Ranges": "bytes", "Content-Type": "application/octet-stream", **(extra or {})}
            rng = _parse_range(self.headers.get("Range"), size)
            if server.fault is None or rng == "unsatisfiable":
                fault = None
            else:
                fault = server.fault(path, *(rng if rng is not None else (-1, -1)))
            if rng is None or fault in ("norange", "drip-full", "biglength"):
                start, end, code = 0, size, 200
            elif rng == "unsatisfiable":
                return self._send(416, {"Content-Range": f"bytes */{size}", "Content-Length": "0"}, b"")
            else:
                (start, end), code = rng, 206
                if fault == "short":
                    end = start + max((end - start) // 2, 1)
                headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
            headers["Content-Length"] = str(end - start) if fault != "biglength" else str(100 * 10**9)
            if fault in ("drip", "drip-full"):
                return self._drip(code, headers, f, start, end)
            self.send_response(code)
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            if not body:
                return
            stop = start + (end - start) // 2 if fault == "drop" else end
            with open(f, "rb") as fh:
                fh.seek(start)
                pos = start
                while pos < stop:
                    chunk = fh.read(min(CHUNK, stop - pos))
                    server.throttle(len(chunk))
                    self.wfile.write(chunk)
                    server.count(len(chunk))
                    pos += len(chunk)
            if fault == "drop":
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)

        def _drip(self, code: int, headers: dict[str, str], f: Path, start: int, end: int) -> None:
            self.send_response(code)
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.flush()
            with open(f, "rb") as fh:
                fh.seek(start)
                self._dripped(fh.read(min(end - start, server.drip_bytes)))

        def _drip_head(self, kind: str) -> None:
            """A status line whose reason phrase never ends, or a header whose value never ends."""
            self.wfile.write(b"HTTP/1.1 200 " if kind == "drip-status" else b"HTTP/1.1 200 OK\r\nX-Pad: ")
            self.wfile.flush()
            self._dripped(b"O" * server.drip_bytes)

        def _endless_error(self) -> None:
            self.send_response(500)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            try:
                for _ in range(256 * 16):
                    self.wfile.write(b"e" * CHUNK)
                    server.count(CHUNK)
            except OSError:  # the client read what it wanted and hung up
                pass

        def _dripped(self, data: bytes) -> None:
            """``data`` one byte per ``drip_s`` seconds, until the client hangs up."""
            server.dripping = time.monotonic()
            try:
                for i in range(len(data)):
                    self.wfile.write(data[i:i + 1])
                    self.wfile.flush()
                    server.count(1)
                    time.sleep(server.drip_s)
            except OSError:  # the client gave up
                server.hung_up_at = time.monotonic()
                server.hung_up.set()
            self.close_connection = True

    return Handler


def _parse_range(value: str | None, size: int) -> tuple[int, int] | str | None:
    """``bytes=a-b`` → (a, b + 1) clipped to the file; ``"unsatisfiable"``; None: no Range."""
    if not value:
        return None
    m = re.fullmatch(r"bytes=(\d*)-(\d*)", value.strip())
    if not m or (not m[1] and not m[2]):
        return None
    if not m[1]:
        start, end = max(size - int(m[2]), 0), size
    else:
        start, end = int(m[1]), min(int(m[2]) + 1 if m[2] else size, size)
    if start >= size or end <= start:
        return "unsatisfiable"
    return start, end


def _etag(f: Path) -> str:
    st = f.stat()
    return hashlib.sha1(f"{f}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key (PEM files in ``directory``), for ``HubServer(tls=...)``;
    a client trusts it with ``SSL_CERT_FILE`` set to the certificate."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    crt, pem = directory / "server.crt", directory / "server.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                      serialization.NoEncryption()))
    return crt, pem
