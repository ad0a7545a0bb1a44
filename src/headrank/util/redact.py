"""URLs with their secrets removed, for everything written or printed (docs/remote-security.md).

A URL may carry credentials in three places: its userinfo (``http://alice:secret@host/``), its
query string (a presigned URL's ``X-Amz-Signature=…``, ``?token=…``, ``sig=…``, Akamai's
``?hdnts=exp=…~hmac=…``) and its fragment (an OAuth implicit grant's ``#access_token=…``).
:func:`redact_url` replaces the password (or a lone user name) by ``***`` and, in the query and
the fragment alike, the value of every key that looks like a signature, token or credential, or
whose value carries one (``…~hmac=…``), by ``REDACTED`` (an opaque fragment or query, not
``key=value`` pairs, whole); :func:`redact_text` does it for
every URL found inside a message. The URL actually requested is never changed: only what is
shown or stored.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "REDACTED"
# query keys whose values are secrets: AWS/GCS/Azure presigned URLs, tokens, API keys, signatures
_SECRET_KEY = re.compile(
    r"^(x-amz-.*|x-goog-.*|x-ms-.*|.*sig|.*signature.*|.*token.*|.*key.*|.*credential.*|.*secret.*|.*password.*|"
    r"passwd|pwd|auth.*|.*session.*|policy|hdnts|hdnea|.*hmac.*|md5|hash|jwt|code|signed.*|.*sas)$", re.IGNORECASE)
# a value that itself carries a signature (Akamai's ``hdnts=exp=…~acl=…~hmac=…``, a nested signed URL)
_SECRET_VALUE = re.compile(r"(?:^|[~&;,:])(?:hmac|sig|signature|token|key|secret|password)\w*=", re.IGNORECASE)
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{1,15}://[^\s'\"<>`]+")


def secret_key(key: str) -> bool:
    """Whether a query key's value is to be hidden."""
    return bool(_SECRET_KEY.match(key.strip()))


def _secret_pair(key: str, value: str) -> bool:
    return secret_key(key) or bool(_SECRET_VALUE.search(value))


def _masked(part: str) -> str:
    """A query string or fragment with the value of every secret pair masked; one that is not
    ``key=value`` pairs but is not empty (``#eyJhbGciOi…``, an opaque token) masked whole."""
    if not part:
        return part
    try:
        pairs = parse_qsl(part, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        pairs = []
    if not pairs:
        return MASK if len(part) > 16 or "=" in part else part  # a short anchor (#section-2) is no secret
    if not any(_secret_pair(k, v) for k, v in pairs):
        return part
    return urlencode([(k, MASK if _secret_pair(k, v) else v) for k, v in pairs], safe="*/")


def redact_url(url: Any) -> Any:
    """``url`` with its userinfo password (or user name) and secret query values masked; anything
    that is not a string comes back as it is, and a string that cannot be parsed as a URL has
    everything after its host cut off when it holds ``@`` or ``?``."""
    if not isinstance(url, str) or "://" not in url:
        return url
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            user, host = netloc.rsplit("@", 1)
            name = user.split(":", 1)[0]
            netloc = f"{'***' if ':' not in user else name + ':***'}@{host}" if user else host
        return urlunsplit((parts.scheme, netloc, parts.path, _masked(parts.query), _masked(parts.fragment)))
    except ValueError:  # not parseable (http://[::1/): keep the scheme only
        head = url.split("://", 1)[0]
        return f"{head}://{MASK}" if any(c in url for c in "@?") else url


def redact_text(text: Any) -> Any:
    """Every URL inside ``text`` redacted (:func:`redact_url`)."""
    if not isinstance(text, str) or "://" not in text:
        return text
    return _URL.sub(lambda m: _trailing(m.group(0)), text)


def _trailing(url: str) -> str:
    """A URL found in prose, with trailing punctuation kept outside the redaction."""
    tail = ""
    while url and url[-1] in ").,;:!":
        url, tail = url[:-1], url[-1] + tail
    return str(redact_url(url)) + tail


def redact_tree(obj: Any) -> Any:
    """A JSON-like structure with every string redacted (:func:`redact_text`)."""
    if isinstance(obj, str):
        return redact_text(obj)
    if isinstance(obj, dict):
        return {k: redact_tree(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact_tree(v) for v in obj)
    return obj
