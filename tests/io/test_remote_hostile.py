"""Hostile servers, moving branches and files that change underfoot (issue 39), against the
Hub-like server on 127.0.0.1 (tests/io/hubserver.py; https with a certificate made here): the
token never travels in clear and no secret is written, a branch moved between the architecture
check and the read cannot mix two models, a file truncated while read is one line, and every
input is bounded (GGUF headers, JSON, whole downloads, slow drips)."""

from __future__ import annotations

import json
import os
import re

import huggingface_hub
import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from headrank.analysis import series as series_mod
from headrank.analysis.scan import analyze
from headrank.analysis.series import track
from headrank.cli import app
from headrank.errors import HeadRankError
from headrank.io import httpio, remote, validate
from headrank.io.checkpoint import Checkpoint
from tests.io.hubserver import HubServer, self_signed
from tests.io.test_remote import ckpts, same, srv  # noqa: F401 - fixtures

CANARY = "hf_canary_5e1f0c2a9d"


def one_line_exit_2(res) -> str:
    lines = res.output.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), res.output
    return lines[0]


@pytest.fixture
def tls_srv(ckpts, monkeypatch, tmp_path_factory):  # noqa: F811
    import huggingface_hub.constants as hc

    crt, key = self_signed(tmp_path_factory.mktemp("tls"))
    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(remote, "BACKOFF_S", 0.0)
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "5")
    monkeypatch.setenv("SSL_CERT_FILE", str(crt))
    huggingface_hub.close_session()  # the shared client is made anew, trusting the certificate
    with HubServer(root=ckpts["root"], tls=(crt, key)) as s:
        s.add("org/llama", "main", ckpts["sharded"])
        monkeypatch.setenv("HF_ENDPOINT", s.url)
        yield s
    huggingface_hub.close_session()


# -- tokens and secrets ----------------------------------------------------------------------------
def test_token_goes_over_https_to_the_endpoint_only(tls_srv, ckpts, monkeypatch, tmp_path):  # noqa: F811
    tls_srv.token = CANARY
    monkeypatch.setenv("HF_TOKEN", CANARY)
    same(analyze("org/llama", remote=True), analyze(ckpts["sharded"]))
    assert f"Bearer {CANARY}" in tls_srv.auth
    monkeypatch.setenv("HF_TOKEN", "wrong")
    res = CliRunner().invoke(app, ["spectra", "org/llama", "--remote", "--out", str(tmp_path / "o"), "-q"])
    assert re.search(r"access refused \(HTTP 401\)", one_line_exit_2(res))
    ep = tls_srv.url
    port = int(ep.rsplit(":", 1)[1])
    for url, sent in ((f"{ep}/x", True), (f"https://127.0.0.1:{port + 1}/x", False), (f"http://127.0.0.1:{port}/x", False),
                      (f"https://localhost:{port}/x", False), ("https://elsewhere.example/x", False)):
        assert httpio.sends_token(url, ep) is sent, url


def test_canary_token_never_in_clear_nor_in_any_output(srv, ckpts, monkeypatch, tmp_path, capfd):  # noqa: F811
    monkeypatch.setenv("HF_TOKEN", CANARY)
    monkeypatch.setattr(httpio, "_warned", set())
    out = tmp_path / "o"
    # the Hub over plain http: no token, one warning line
    res = CliRunner().invoke(app, ["spectra", "org/llama", "--remote", "--out", str(out / "hub"), "--no-plots"])
    assert res.exit_code == 0, res.output
    assert "token is not sent over plain http" in res.output
    # a URL with a password and a presigned query: read, and never written or printed
    url = (f"http://alice:{CANARY}@{srv.url.removeprefix('http://')}/files/gpt2/model.safetensors"
           f"?X-Amz-Signature={CANARY}&X-Amz-Credential={CANARY}&sig={CANARY}")
    res2 = CliRunner().invoke(app, ["spectra", url, "--out", str(out / "url"), "--no-plots"])
    assert res2.exit_code == 0, res2.output
    bad = url.replace("model.safetensors", "missing.safetensors")
    res3 = CliRunner().invoke(app, ["spectra", bad, "--out", str(out / "bad"), "-q"])
    assert res3.exit_code == 2
    written = [p for p in out.rglob("*") if p.is_file()]
    assert len(written) >= 6
    for p in written:
        assert CANARY.encode() not in p.read_bytes(), p
    for text in (res.output, res2.output, res3.output, *capfd.readouterr()):
        assert CANARY not in text
    assert not any(a and a.startswith("Bearer") for a in srv.auth)  # plain http never saw the token
    meta = json.loads((out / "url" / "meta.json").read_text())
    assert "alice:***@" in meta["source"] and "X-Amz-Signature=REDACTED" in meta["source"]


def test_malformed_urls_are_one_line(srv, tmp_path):  # noqa: F811
    for url in ("http://[::1/", "http://host:notaport/x/", "https:///nohost/"):
        res = CliRunner().invoke(app, ["spectra", url, "--out", str(tmp_path / "o"), "-q"])
        assert "not a URL that can be read" in one_line_exit_2(res), url


# -- one commit per revision ----------------------------------------------------------------------
def test_branch_moved_between_check_and_read_is_not_mixed(srv, ckpts, tmp_path, monkeypatch):  # noqa: F811
    checked = series_mod.check_architectures
    before = srv.commits[("org/pythia", "step100")]

    def check_then_move(*a, **k):
        arch = checked(*a, **k)
        srv.move("org/pythia", "step100", ckpts["gpt2"])  # another architecture, another commit
        return arch

    monkeypatch.setattr(series_mod, "check_architectures", check_then_move)
    res = track("org/pythia", tmp_path / "t", revisions="step0,step100", remote=True, workers=1, plots=False)
    rows = res.table[res.table["step"] == 100]
    assert set(rows["commit"]) == {before} and set(rows["kv_head"]) == {0, 1}  # the llama checked: 2 kv heads
    ref = analyze(ckpts["steps"][100]).table.sort_values(["layer", "product", "head"])
    got = rows.sort_values(["layer", "product", "head"])
    np.testing.assert_array_equal(got["effective_rank"].to_numpy(), ref["effective_rank"].to_numpy())
    spec = json.loads((tmp_path / "t" / "series.json").read_text())
    assert {it["label"]: it["commit"] for it in spec["items"]}["step100"] == before
    assert "commit" in pd.read_csv(tmp_path / "t" / "table.csv").columns
    # spectra --remote: the branch moves after config.json was read; every file comes from the commit first seen
    monkeypatch.setattr(series_mod, "check_architectures", checked)
    first = srv.commits[("org/llama", "main")]
    srv.before_read = lambda repo, rev, name: (srv.move("org/llama", "main", ckpts["gpt2"])
                                               if name.endswith(".safetensors") and rev == "main" else None)
    got = analyze("org/llama", remote=True)
    assert got.meta["hub"]["commit"] == first
    same(got, analyze(ckpts["sharded"]))


# -- files that change underfoot ------------------------------------------------------------------
def _truncate_after_first_read(monkeypatch, target):
    from headrank.io import stfile

    real = stfile.StampedFile.pread
    state = {"n": 0}

    def pread(self, n, at):
        if self.path == target and at > 8 + 4096:  # past the header: a tensor read
            state["n"] += 1
            if state["n"] == 2:
                os.truncate(target, os.path.getsize(target) // 2)
        return real(self, n, at)

    monkeypatch.setattr(stfile.StampedFile, "pread", pread)


def test_safetensors_truncated_while_read_is_one_line(ckpts, tmp_path, monkeypatch):  # noqa: F811
    import shutil

    d = tmp_path / "m"
    shutil.copytree(ckpts["steps"][0], d)
    c = Checkpoint(d)
    name = next(n for n in c.keys() if "q_proj" in n)
    c.get(name)
    os.truncate(d / "model.safetensors", 1000)
    with pytest.raises(HeadRankError, match="changed while it was read"):
        c.get(name)
    c.close()
    shutil.copy(ckpts["steps"][0] / "model.safetensors", d / "model.safetensors")
    _truncate_after_first_read(monkeypatch, d / "model.safetensors")
    res = CliRunner().invoke(app, ["spectra", str(d), "--out", str(tmp_path / "o"), "-q"])
    assert "model.safetensors changed while it was read" in one_line_exit_2(res)
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_track_records_a_checkpoint_truncated_after_its_check(ckpts, tmp_path, monkeypatch):  # noqa: F811
    import shutil

    dirs = []
    for step, d in ckpts["steps"].items():
        dirs.append(tmp_path / f"step-{step}")
        shutil.copytree(d, dirs[-1])
    checked = series_mod.check_architectures

    def check_then_truncate(*a, **k):
        arch = checked(*a, **k)
        f = dirs[1] / "model.safetensors"
        os.truncate(f, os.path.getsize(f) - 4096)
        return arch

    monkeypatch.setattr(series_mod, "check_architectures", check_then_truncate)
    res = track([str(d) for d in dirs], tmp_path / "t", workers=2, plots=False)
    assert list(res.failed) == ["step-100"] and re.search("outside the file|changed while it was read",
                                                          res.failed["step-100"])
    assert sorted(res.table["step"].unique()) == [0, 200]


def test_track_skips_a_checkpoint_that_vanished(ckpts, tmp_path, monkeypatch):  # noqa: F811
    import shutil

    dirs = []
    for step, d in ckpts["steps"].items():
        dirs.append(tmp_path / f"step-{step}")
        shutil.copytree(d, dirs[-1])
    checked = series_mod.check_architectures

    def check_then_rotate(*a, **k):
        arch = checked(*a, **k)
        shutil.rmtree(dirs[0])  # a training run rotated its oldest checkpoint away
        return arch

    monkeypatch.setattr(series_mod, "check_architectures", check_then_rotate)
    res = track([str(d) for d in dirs], tmp_path / "t", workers=1, plots=False)
    assert res.vanished == ["step-0"] and not res.failed and sorted(res.table["step"].unique()) == [100, 200]


# -- overlapping tensors: one check for both paths --------------------------------------------------
def test_overlapping_tensors_refused_locally_and_remotely(srv, ckpts, tmp_path):  # noqa: F811
    data = (ckpts["steps"][0] / "model.safetensors").read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    q = "model.layers.0.self_attn.q_proj.weight"
    k = "model.layers.0.self_attn.k_proj.weight"
    size = header[k]["data_offsets"][1] - header[k]["data_offsets"][0]
    header[k]["data_offsets"] = [header[q]["data_offsets"][0], header[q]["data_offsets"][0] + size]  # shares q's bytes
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    bad = ckpts["root"] / "overlap"
    bad.mkdir(exist_ok=True)
    (bad / "config.json").write_bytes((ckpts["steps"][0] / "config.json").read_bytes())
    (bad / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + data[8 + n:])
    with pytest.raises(HeadRankError, match="invalid offset") as local:
        analyze(bad)
    with pytest.raises(HeadRankError, match="invalid offset") as over_http:
        analyze(f"{srv.url}/files/overlap/")
    assert str(local.value).split(": ", 1)[1] == str(over_http.value).split(": ", 1)[1]


# -- bounded everything ----------------------------------------------------------------------------
def _huge_gguf(path, n_kv):
    """A GGUF header that declares ``n_kv`` one-byte metadata entries (1 MiB of them written)."""
    import struct

    body = bytearray(b"GGUF" + struct.pack("<IQQ", 3, 0, n_kv))
    entry = struct.pack("<Q", 1) + b"k" + struct.pack("<I", 0) + b"\x01"
    body += entry * ((1 << 20) // len(entry))
    path.write_bytes(bytes(body))
    return path


def _array_gguf(path, count):
    import struct

    body = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + b"a" + struct.pack("<IIQ", 9, 8, count)
    path.write_bytes(body + b"\0" * (1 << 20))
    return path


@pytest.mark.parametrize("kind", ["entries", "strings"])
def test_huge_gguf_headers_refused_before_the_reader(srv, ckpts, kind, monkeypatch):  # noqa: F811
    pytest.importorskip("gguf")
    import gguf

    def boom(*a, **k):
        raise AssertionError("GGUFReader must not run")

    monkeypatch.setattr(gguf, "GGUFReader", boom)
    p = ckpts["root"] / f"huge-{kind}.gguf"
    _huge_gguf(p, 4_000_000) if kind == "entries" else _array_gguf(p, 8_000_000)
    with pytest.raises(HeadRankError, match="a GGUF header may hold"):
        analyze(p)
    before = set(os.listdir(remote.tempfile.gettempdir()))
    srv.reset()
    with pytest.raises(HeadRankError, match="a GGUF header may hold") as e:
        analyze(f"{srv.url}/files/{p.name}")
    assert srv.sent <= (1 << 20) + 8 and "headrank-remote" not in str(e.value)
    assert not [f for f in set(os.listdir(remote.tempfile.gettempdir())) - before if f.startswith("headrank-remote-")]


def test_temp_files_of_a_dead_process_are_swept(tmp_path):
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    left = tmp_path / f"{httpio.TMP_PREFIX}{dead}-gguf-abc.gguf"
    mine = tmp_path / f"{httpio.TMP_PREFIX}{os.getpid()}-gguf-abc.gguf"
    old = tmp_path / "attnrank-gguf-header-x.gguf"
    for p in (left, mine, old):
        p.write_bytes(b"GGUF")
    os.utime(old, (0, 0))
    assert sorted(httpio.sweep_temp(str(tmp_path))) == sorted([str(left), str(old)])
    assert mine.exists() and not left.exists()


def test_json_caps_and_budget(srv, ckpts, monkeypatch, tmp_path):  # noqa: F811
    monkeypatch.setitem(validate.JSON_CAPS, "config", 200)
    with pytest.raises(HeadRankError, match="more than a config may be"):
        analyze("org/llama", remote=True)
    with pytest.raises(HeadRankError, match="more than a config may be"):
        analyze(ckpts["sharded"])
    monkeypatch.setitem(validate.JSON_CAPS, "config", 16 << 20)
    monkeypatch.setitem(validate.JSON_CAPS, "list of refs", 100)
    with pytest.raises(HeadRankError, match="list of refs"):
        remote.list_revisions("org/pythia")
    monkeypatch.setattr(validate, "JSON_BUDGET", 1 << 20)  # a header of {} that parses into 20x its size
    blob = b"{" + b",".join(b'"t%d":{}' % i for i in range(20000)) + b"}"
    with pytest.raises(HeadRankError, match="would take about .* of memory"):
        validate.parse_json(blob, "safetensors header", "x.safetensors")


def _no_temp_file(monkeypatch):
    made = []
    real = remote.tempfile.TemporaryFile
    monkeypatch.setattr(remote.tempfile, "TemporaryFile", lambda *a, **k: made.append(1) or real(*a, **k))
    return made


def test_allow_full_checks_content_length_before_writing(srv, ckpts, monkeypatch):  # noqa: F811
    srv.fault = lambda path, start, end: "norange"
    made = _no_temp_file(monkeypatch)
    with pytest.raises(HeadRankError, match=r"more than `max_bytes`"):
        analyze("org/llama", remote=True, allow_full=1000)
    assert not made
    res = CliRunner().invoke(app, ["spectra", "org/llama", "--remote", "--allow-full", "--max-bytes", "1000", "-q"])
    assert "more than --max-bytes" in one_line_exit_2(res)
    # a Content-Length of 100 GB: refused by the default (twice the attention bytes its header lists) at once
    srv.fault = lambda path, start, end: "biglength" if path.endswith(".safetensors") else None
    srv.reset()
    res = CliRunner().invoke(app, ["spectra", "org/llama", "--remote", "--allow-full", "-q"])
    line = one_line_exit_2(res)
    assert re.search(r"is 100,000,000,000 bytes, more than twice the [\d,]+ bytes of attention tensors its header lists", line)
    assert not made and srv.sent < 3 * (1 << 20)  # the server stopped at the header, nothing written


def _attention_apart(ckpts, name):  # noqa: F811
    """The llama of step 0 in two shards: every attention tensor in one, everything else in the other."""
    from safetensors.torch import load_file, save_file

    d = ckpts["root"] / name
    d.mkdir(exist_ok=True)
    tensors = load_file(str(ckpts["steps"][0] / "model.safetensors"))
    attn = {k: v for k, v in tensors.items() if ".self_attn." in k}
    save_file(attn, str(d / "attn.safetensors"), metadata={"format": "pt"})
    save_file({k: v for k, v in tensors.items() if k not in attn}, str(d / "rest.safetensors"),
              metadata={"format": "pt"})
    (d / "config.json").write_bytes((ckpts["steps"][0] / "config.json").read_bytes())
    index = {"metadata": {}, "weight_map": {k: "attn.safetensors" if k in attn else "rest.safetensors" for k in tensors}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    return d


def test_allow_full_default_is_twice_the_attention_bytes(srv, ckpts, monkeypatch):  # noqa: F811
    """``allow_full`` without ``max_bytes``: a file is downloaded whole when it holds at most twice
    the attention bytes its header lists; one that holds none keeps its header only; one whose
    attention is less than half of it is refused before a byte is written."""
    srv.fault = lambda path, start, end: "norange"
    made = _no_temp_file(monkeypatch)
    with pytest.raises(HeadRankError, match=r"model-00001-of-00003.safetensors is 50,432 bytes, more than twice "
                                            r"the 24,576 bytes of attention tensors its header lists"):
        analyze("org/llama", remote=True, allow_full=True)  # about 49 % attention: refused
    assert not made
    d = _attention_apart(ckpts, "apart")
    srv.reset()
    got = analyze(f"{srv.url}/files/apart/", allow_full=True)
    same(got, analyze(ckpts["steps"][0]))
    # rest holds nothing the analysis reads: the index says so, and it is not requested at all
    assert len(made) == 1 and sorted(got.meta["remote"]["full_downloads"]) == ["attn.safetensors"]
    rest = (d / "rest.safetensors").stat().st_size
    received = got.meta["remote"]["bytes_fetched"]
    assert received < (d / "attn.safetensors").stat().st_size + rest // 2, received
    with pytest.raises(HeadRankError, match=r"rest.safetensors holds no attention tensor, so only its header was "
                                            r"downloaded .* pass `max_bytes`"):
        analyze(f"{srv.url}/files/apart/", allow_full=True, fold_norm=True)  # the norm gains lie in rest
    same(analyze(f"{srv.url}/files/apart/", allow_full=10 << 20, fold_norm=True),
         analyze(ckpts["steps"][0], fold_norm=True))


# every request (config, shard index, safetensors header, tensor range, refs API, a whole download),
# and every part of its answer: status line, headers, body
DRIPS = [("config", "drip-status"), ("tensor", "drip-headers"), ("tensor", "drip"),
         *(pytest.param(*c, marks=pytest.mark.slow) for c in (
             ("config", "drip-headers"), ("config", "drip"), ("tensor", "drip-status"), ("index", "drip-headers"),
             ("header", "drip-status"), ("refs", "drip-status"), ("full", "drip-full")))]


@pytest.mark.parametrize(("target", "how"), DRIPS)
def test_a_drip_anywhere_in_an_answer_ends_at_the_deadline(srv, tmp_path, monkeypatch, target, how):  # noqa: F811
    import time

    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "0.5")  # a deadline of 1.5 s plus the bytes at 64 KiB/s
    srv.drip_s, srv.drip_bytes = 0.05, 400  # a byte 10x within the read timeout: 20 s a try unless cut short
    hit = {"config": lambda p, a: p.endswith("/config.json"), "index": lambda p, a: p.endswith(".index.json"),
           "header": lambda p, a: p.endswith(".safetensors") and a == 0, "tensor": lambda p, a: a > 4096,
           "refs": lambda p, a: p.endswith("/refs"), "full": lambda p, a: p.endswith(".safetensors")}[target]

    def hook(path, start, end):
        return how if hit(path, start) else None

    if how in ("drip-status", "drip-headers"):
        srv.head_fault = hook
    else:
        srv.fault = hook
    args = (["track", "org/pythia", "--remote", "--revisions", "all", "--out", str(tmp_path / "t")]
            if target == "refs" else ["spectra", "org/llama", "--remote", "--out", str(tmp_path / "o")])
    began = time.monotonic()
    res = CliRunner().invoke(app, [*args, *(["--allow-full"] if target == "full" else []), "-q"])
    took = time.monotonic() - began
    assert re.search(r"the server is too slow: .* more than a request may take", one_line_exit_2(res))
    assert srv.hung_up.wait(30), "the client never closed the dripping connection"
    assert srv.hung_up_at - srv.dripping < 20 and took < 45, (srv.hung_up_at - srv.dripping, took)
    assert not (tmp_path / "o").exists() and not (tmp_path / "t" / "table.csv").exists()


def test_a_proxy_in_the_environment_is_used(srv, ckpts, monkeypatch):  # noqa: F811
    with HubServer(root=ckpts["root"]) as proxy:  # answers "GET http://host/files/..." from the same files
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        same(analyze(f"{srv.url}/files/gpt2/"), analyze(ckpts["gpt2"]))
        assert proxy.log and not srv.log
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        proxy.reset()
        analyze(f"{srv.url}/files/gpt2/")
        assert srv.log and not proxy.log


def test_an_endless_error_answer_is_read_for_its_first_bytes_only(srv, tmp_path):  # noqa: F811
    srv.head_fault = lambda path, start, end: "endless-error" if path.endswith("config.json") else None
    srv.reset()
    res = CliRunner().invoke(app, ["spectra", "org/llama", "--remote", "--out", str(tmp_path / "o"), "-q"])
    assert re.search(r"cannot read config.json .* HTTP 500 \(4 tries\)", one_line_exit_2(res))
    assert srv.sent < 64 << 20, srv.sent  # 4 answers of 256 MiB offered: each read for 64 KiB (and socket buffers)


def test_architecture_checks_run_on_a_bounded_pool_with_progress(srv, monkeypatch):  # noqa: F811
    import threading

    seen, lock, now = [], threading.Lock(), {"n": 0, "most": 0}
    real = series_mod._architecture

    def counted(item):
        with lock:
            now["n"] += 1
            now["most"] = max(now["most"], now["n"])
        try:
            return real(item)
        finally:
            with lock:
                now["n"] -= 1

    monkeypatch.setattr(series_mod, "_architecture", counted)
    monkeypatch.setattr(series_mod, "ARCH_THREADS", 2)
    items = series_mod.resolve_series("org/pythia", "step0,step100,step200", remote=True)
    ids, commits = {}, {}
    series_mod.check_architectures(items, ids, lambda d, t: seen.append((d, t)), commits)
    assert seen == [(1, 3), (2, 3), (3, 3)] and now["most"] <= 2
    assert commits == {f"step{s}": srv.commits[("org/pythia", f"step{s}")] for s in (0, 100, 200)}


def test_remote_reader_reports_nothing_of_the_real_url_in_errors(srv, ckpts, tmp_path):  # noqa: F811
    url = f"http://bob:{CANARY}@{srv.url.removeprefix('http://')}/files/none/?token={CANARY}"
    with pytest.raises(HeadRankError) as e:
        analyze(url)
    assert CANARY not in str(e.value) and "bob:***@" in str(e.value)


def test_table_of_torch_file_still_reads(tmp_path):
    """A .bin checkpoint (torch.load, memory-mapped) is unchanged by the pread reader of safetensors."""
    import transformers as tf

    torch.manual_seed(0)
    m = tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=50, n_positions=16))
    m.save_pretrained(tmp_path / "bin", safe_serialization=False)
    m.save_pretrained(tmp_path / "st", safe_serialization=True)
    same(analyze(tmp_path / "bin"), analyze(tmp_path / "st"))


# -- a stopped track run keeps what it had, and --resume continues it ------------------------------
def test_a_killed_track_resumes_to_the_table_of_an_uninterrupted_run(srv, ckpts, tmp_path):  # noqa: F811
    import signal
    import subprocess
    import sys
    import threading

    revs = ["--revisions", "step0,step100,step200", "--remote", "--workers", "1", "--no-plots"]
    out = tmp_path / "killed run"
    last = srv.commits[("org/pythia", "step200")]
    reached, release = threading.Event(), threading.Event()

    def hold_the_last(path, start, end):  # step200's first tensor waits until the test has killed the run
        if last in path and start > 4096:
            reached.set()
            release.wait(120)
        return None

    srv.fault = hold_the_last
    p = subprocess.Popen([sys.executable, "-m", "headrank", "track", "org/pythia", *revs, "--out", str(out), "-q"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert reached.wait(300), p.stderr.read() if p.poll() is not None else "the run never reached step200"
        partial = pd.read_csv(out / "table.partial.csv")  # the rows of what finished, on disk while it runs
        assert sorted(partial["checkpoint"].unique()) == ["step0", "step100"]
    finally:
        p.send_signal(signal.SIGKILL)
        p.communicate()
        release.set()
    srv.fault = None
    assert not (out / "table.csv").exists() and (out / "started.json").is_file()
    # a plain re-run, another series and other options are refused with one line
    other = ["--revisions", "step0,step200", *revs[2:]]
    for args, needle in (([*revs], "stopped before it finished .* pass --resume"),
                         ([*revs, "--resume", "--tol", "0.01"], r"other settings \(--tol 0.001 there, 0.01 here\)"),
                         ([*other, "--resume"], r"other settings \(--revisions step0,step100,step200 there"),
                         ([*revs, "--resume", "--force"], "--resume continues a stopped run")):
        res = CliRunner().invoke(app, ["track", "org/pythia", *args, "--out", str(out), "-q"])
        assert re.search(needle, one_line_exit_2(res)), (args, res.output)
    stamps = {f.name: f.stat().st_mtime_ns for f in (out / "checkpoints").iterdir()}
    srv.reset()
    res = CliRunner().invoke(app, ["track", "org/pythia", *revs, "--out", str(out), "--resume", "--json"])
    assert res.exit_code == 0, res.output
    done = json.loads(res.output)
    assert done["computed"] == ["step200"] and done["skipped"] == ["step0", "step100"]
    asked = {p for _, p, _ in srv.log}
    assert asked and all(last in p for p in asked), asked  # nothing asked of the finished revisions
    assert all((out / "checkpoints" / n).stat().st_mtime_ns == t for n, t in stamps.items())
    assert not (out / "table.partial.csv").exists()
    whole = track("org/pythia", tmp_path / "whole", revisions="step0,step100,step200", remote=True, workers=1,
                  plots=False)
    pd.testing.assert_frame_equal(pd.read_csv(out / "table.csv"), pd.read_csv(whole.out / "table.csv"),
                                  check_exact=True)
    assert (out / "summary.csv").read_bytes() == (whole.out / "summary.csv").read_bytes()
