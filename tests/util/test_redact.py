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


@pytest.mark.parametrize(("url", "want"), [
    ("https://h/cb#access_token=SECRET&state=1", "https://h/cb#access_token=REDACTED&state=1"),
    ("https://h/m/#token=SECRET", "https://h/m/#token=REDACTED"),
    ("https://h/m/#eyJhbGciOiJIUzI1NiJ9.SECRET.sig", "https://h/m/#REDACTED"),
    ("https://h/m/#section-2", "https://h/m/#section-2"),
    ("https://cdn/m.safetensors?hdnts=exp=1~acl=/*~hmac=SECRET", "https://cdn/m.safetensors?hdnts=REDACTED"),
    ("https://cdn/m?p=exp=1~hmac=SECRET&page=2", "https://cdn/m?p=REDACTED&page=2"),
    ("https://h/f?Signature=SECRET&Key-Pair-Id=K&Policy=P", "https://h/f?Signature=REDACTED&Key-Pair-Id=REDACTED&Policy=REDACTED"),
    ("https://h/f?md5=SECRET&expires=9", "https://h/f?md5=REDACTED&expires=9"),
])
def test_fragments_and_signed_values_are_redacted(url, want):
    assert redact_url(url) == want and "SECRET" not in redact_text(f"see {url}.")


def test_no_secret_of_a_url_lands_in_any_output(tmp_path):
    """spectra over a 127.0.0.1 URL carrying a fragment token and a signed query: every file
    written (meta.json, heads.csv, ...) and the error line of a failing URL are free of them."""
    import os
    import subprocess
    import sys

    import torch
    import transformers as tf

    from tests.io.hubserver import HubServer

    torch.manual_seed(0)
    model = tmp_path / "srv" / "m"
    tf.LlamaForCausalLM(tf.LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                       intermediate_size=32, vocab_size=50)).save_pretrained(model)
    secrets = ("FRAGSECRET1", "HMACSECRET2", "TOKSECRET3")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN")}
    with HubServer(root=tmp_path / "srv") as s:
        for i, url in enumerate([f"{s.url}/files/m/?hdnts=exp=1~acl=/*~hmac={secrets[1]}#access_token={secrets[0]}",
                                 f"{s.url}/files/nothing/?sig=x#token={secrets[2]}"]):
            out = tmp_path / f"out{i}"
            r = subprocess.run([sys.executable, "-m", "headrank", "spectra", url, "--out", str(out)],
                               capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
            assert r.returncode == (0 if i == 0 else 2), r.stderr
            text = r.stdout + r.stderr + "".join(p.read_text(errors="replace") for p in out.rglob("*") if p.is_file())
            assert not any(x in text for x in secrets), [x for x in secrets if x in text]
        url = f"{s.url}/files/m/?hdnts=exp=1~acl=/*~hmac={secrets[1]}#access_token={secrets[0]}"
        r = subprocess.run([sys.executable, "-m", "headrank", "compress", url, "--out", str(tmp_path / "c"),
                            "--rank", "4"], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path / "srv")
        assert r.returncode == 0 and (tmp_path / "c" / "compress.json").exists(), r.stderr
        text = r.stdout + r.stderr + "".join(p.read_text(errors="replace") for p in (tmp_path / "c").rglob("*.json"))
        assert not any(x in text for x in secrets), [x for x in secrets if x in text]
    assert (tmp_path / "out0" / "meta.json").exists()
