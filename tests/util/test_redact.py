"""URL redaction (headrank.util.redact): secrets out, everything else kept."""

from __future__ import annotations

import pytest

from headrank.util.redact import redact_text, redact_tree, redact_url


@pytest.mark.parametrize(("url", "want"), [
    ("http://alice:s3cret@host/ckpt/", "http://alice:***@host/ckpt/"),
    ("https://tok3n@host/x", "https://***@host/x"),
    ("https://b.s3.amazonaws.com/m.safetensors?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=abc&versionId=3",
     "https://b.s3.amazonaws.com/m.safetensors?X-Amz-Algorithm=REDACTED&X-Amz-Signature=REDACTED&versionId=3"),
    ("https://h/f?sv=2020&sig=xyz&se=2030", "https://h/f?sv=2020&sig=REDACTED&se=2030"),
    ("https://h/f?access_token=a&api_key=b&page=2", "https://h/f?access_token=REDACTED&api_key=REDACTED&page=2"),
    ("https://huggingface.co/org/m/resolve/main/config.json", "https://huggingface.co/org/m/resolve/main/config.json"),
    ("http://[::1/?sig=1", "http://REDACTED"),
    ("org/name", "org/name"),
])
def test_redact_url(url, want):
    assert redact_url(url) == want


def test_redact_text_and_tree():
    msg = "cannot read http://a:pw@h/x.json (see https://h/y?token=zz)."
    assert redact_text(msg) == "cannot read http://a:***@h/x.json (see https://h/y?token=REDACTED)."
    tree = {"source": "http://a:pw@h/", "files": ["https://h/f?sig=1"], "n": 3}
    assert redact_tree(tree) == {"source": "http://a:***@h/", "files": ["https://h/f?sig=REDACTED"], "n": 3}
