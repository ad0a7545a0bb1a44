"""Remote reading over HTTP ranges (headrank.io.remote), against a Hub-like server on 127.0.0.1
(tests/io/hubserver.py) serving checkpoints written here: the spectra equal those read from
disk, only config, index, headers and the attention tensors travel, and bad servers or bad
input give one line (exit 2) and never wrong numbers or partial outputs."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
import torch
import transformers as tf
from safetensors import safe_open
from typer.testing import CliRunner

from headrank.analysis.scan import analyze
from headrank.analysis.series import track
from headrank.cli import app
from headrank.errors import HeadRankError
from headrank.io import remote
from tests.io.hubserver import HubServer

SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96, vocab_size=101)
ATTN = (".self_attn.", ".attn.c_attn.", ".attn.c_proj.")


def _llama(path, seed=0, dtype=None, shard=None):
    torch.manual_seed(seed)
    m = tf.LlamaForCausalLM(tf.LlamaConfig(**SMALL, num_key_value_heads=2)).eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)  # non-trivial gains, so --fold-norm reads something
    if dtype is not None:
        m = m.to(dtype)
    m.save_pretrained(path, safe_serialization=True, **({"max_shard_size": shard} if shard else {}))
    return path


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("remote")
    gpt2 = root / "gpt2"
    torch.manual_seed(1)
    tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=101, n_positions=32)).save_pretrained(
        gpt2, safe_serialization=True)
    return {"root": root, "sharded": _llama(root / "sharded", dtype=torch.bfloat16, shard="60KB"),
            "steps": {s: _llama(root / f"step{s}", seed=s) for s in (0, 100, 200)}, "gpt2": gpt2}


@pytest.fixture
def srv(ckpts, monkeypatch):
    import huggingface_hub.constants as hc

    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", False)  # conftest set it before huggingface_hub was imported
    monkeypatch.setattr(remote, "BACKOFF_S", 0.0)
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "5")
    with HubServer(root=ckpts["root"]) as s:
        s.add("org/llama", "main", ckpts["sharded"])
        for step, d in ckpts["steps"].items():
            s.add("org/pythia", f"step{step}", d)
        s.add("org/pythia", "main", ckpts["steps"][200])
        monkeypatch.setenv("HF_ENDPOINT", s.url)
        yield s


def same(a, b):
    for p in ("qk", "ov"):
        np.testing.assert_array_equal(a.sv[p], b.sv[p])
    pd.testing.assert_frame_equal(a.table, b.table)


def expected_bytes(d, fold_norm=False):
    """Attention (+ norm gain) tensor bytes, safetensors headers and the JSON files of a checkpoint."""
    total = sum(f.stat().st_size for f in d.glob("*.json"))
    for f in d.glob("*.safetensors"):
        total += 8 + int.from_bytes(f.read_bytes()[:8], "little")
        with safe_open(str(f), "pt") as h:
            for n in h.keys():
                if any(a in n for a in ATTN) or (fold_norm and "input_layernorm" in n):
                    total += h.get_tensor(n).nbytes
    return total


# -- equal to disk, and only the attention travels -------------------------------------------------
def test_hub_id_sharded_bf16_equals_disk_and_fetches_only_attention(srv, ckpts):
    d = ckpts["sharded"]
    assert len(list(d.glob("*.safetensors"))) >= 2 and (d / "model.safetensors.index.json").exists()
    local = analyze(d)
    srv.reset()
    got = analyze("org/llama", remote=True)
    same(got, local)
    assert srv.sent <= 1.05 * expected_bytes(d), (srv.sent, expected_bytes(d))
    m = got.meta
    assert m["input"] == "remote" and m["hub"]["commit"] == srv.commits[("org/llama", "main")]
    assert m["remote"]["bytes_fetched"] == srv.sent  # bodies, counted on both sides
    # shards are opened only where a tensor is read: the checkpoint's size is the one its index declares
    assert m["remote"]["checkpoint_bytes"] == json.loads((d / "model.safetensors.index.json").read_text())[
        "metadata"]["total_size"]
    assert 0 < m["remote"]["share"] < 0.6 and m["dtype_read"] == ["bfloat16"]
    files = [p for meth, p, _ in srv.log if "/resolve/" in p and not p.endswith("config.json")]
    assert files and all(f"/resolve/{m['hub']['commit']}/" in p for p in files)  # pinned to the commit
    srv.reset()
    folded = analyze("org/llama", remote=True, fold_norm=True)
    same(folded, analyze(d, fold_norm=True))
    assert srv.sent <= 1.05 * expected_bytes(d, fold_norm=True)


def test_url_directory_single_file_and_gguf(srv, ckpts, tmp_path, monkeypatch):
    gpt2 = ckpts["gpt2"]
    local = analyze(gpt2)
    same(analyze(f"{srv.url}/files/gpt2/"), local)
    same(analyze(f"{srv.url}/files/gpt2/model.safetensors"), local)  # its sibling config.json
    # GGUF: header fetched in growing chunks from 256 bytes, then only the attention tensors
    gguf = pytest.importorskip("gguf")
    from headrank.io.gguf import permute_rotary

    model = tf.LlamaForCausalLM.from_pretrained(ckpts["steps"][0])
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    path = ckpts["root"] / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for add, v in ((w.add_block_count, 2), (w.add_embedding_length, 64), (w.add_head_count, 4),
                   (w.add_head_count_kv, 2), (w.add_key_length, 16), (w.add_value_length, 16)):
        add(v)
    w.add_token_list([f"tok{i}" for i in range(101)])
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(2):
        p = f"model.layers.{i}.self_attn."
        q = permute_rotary(torch.from_numpy(sd[p + "q_proj.weight"]), 4).numpy()
        k = permute_rotary(torch.from_numpy(sd[p + "k_proj.weight"]), 2).numpy()
        w.add_tensor(f"blk.{i}.attn_q.weight", gguf.quants.quantize(q, gguf.GGMLQuantizationType.Q8_0),
                     raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        for name, arr in (("attn_k", k), ("attn_v", sd[p + "v_proj.weight"]), ("attn_output", sd[p + "o_proj.weight"]),
                          ("attn_norm", sd[f"model.layers.{i}.input_layernorm.weight"])):
            w.add_tensor(f"blk.{i}.{name}.weight", arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    monkeypatch.setattr(remote, "GGUF_FIRST_CHUNK", 256)
    srv.reset()
    got = analyze(f"{srv.url}/files/m.gguf", fold_norm=True)
    same(got, analyze(path, fold_norm=True))
    assert got.meta["gguf"]["quantization_types"] == {"Q8_0": 2, "F32": 6} and got.meta["input"] == "remote"
    r = gguf.GGUFReader(path)
    attn = sum(t.n_bytes for t in r.tensors if t.name.startswith("blk."))
    assert got.meta["remote"]["tensor_bytes"] == attn  # the embedding never travelled
    assert got.meta["remote"]["url"] == f"{srv.url}/files/m.gguf"  # the file's own URL, name included
    assert got.meta["remote"]["metadata_bytes"] <= 4 * r.data_offset + 8


def test_cli_remote_writes_meta_and_prints_the_bytes(srv, tmp_path):
    res = CliRunner().invoke(app, ["spectra", "org/llama", "--remote", "--revision", "main", "--out",
                                   str(tmp_path / "o"), "--no-plots"])
    assert res.exit_code == 0, res.output
    meta = json.loads((tmp_path / "o" / "meta.json").read_text())
    r = meta["remote"]
    assert r["bytes_fetched"] > 0 and r["tensor_bytes"] > 0 and 0 < r["share"] < 1 and r["requests"] > 4
    assert "remote: fetched" in res.output and f"({100 * r['share']:.2f} %)" in res.output


# -- bad servers ---------------------------------------------------------------------------------
def test_dropped_connection_is_retried_then_fails_with_one_line(srv, ckpts, tmp_path):
    drops = {"left": 2}

    def drop_twice(path, start, end):
        if start > 4096 and drops["left"] > 0:
            drops["left"] -= 1
            return "drop"
        return None

    srv.fault = drop_twice
    got = analyze("org/llama", remote=True)
    same(got, analyze(ckpts["sharded"]))
    assert got.meta["remote"]["retries"] == 2
    srv.fault = lambda path, start, end: "drop" if start > 4096 else None
    with pytest.raises(HeadRankError, match=r"cannot read bytes .* \(4 tries\)"):
        analyze("org/llama", remote=True)
    res = CliRunner().invoke(app, ["spectra", "org/llama", "--remote", "--out", str(tmp_path / "o"), "-q"])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert "error:" in res.output and not (tmp_path / "o").exists()


def test_server_ignoring_range_is_refused_unless_allow_full(srv, ckpts):
    srv.fault = lambda path, start, end: "norange"
    with pytest.raises(HeadRankError, match="ignores HTTP range requests.*`allow_full`"):
        analyze("org/llama", remote=True)
    srv.reset()
    got = analyze("org/llama", remote=True, allow_full=10 << 20)  # the default: tests/io/test_remote_hostile.py
    same(got, analyze(ckpts["sharded"]))
    wm = json.loads((ckpts["sharded"] / "model.safetensors.index.json").read_text())["weight_map"]
    shards = sorted({f for n, f in wm.items() if any(a in n for a in ATTN)})  # only shards holding attention
    meta = got.meta["remote"]
    assert sorted(meta["full_downloads"]) == shards
    assert meta["protocol"].startswith("whole files downloaded") and meta["tensor_bytes"] > 0
    assert meta["full_bytes"] == sum((ckpts["sharded"] / f).stat().st_size for f in shards)


@pytest.mark.parametrize("case", ["no repo", "no revision", "gated", "header longer than file",
                                  "tensor outside file", "redirect loop", "truncated", "not found"])
def test_bad_input_one_line_exit_2(srv, ckpts, tmp_path, monkeypatch, case):
    args = ["org/llama", "--remote"]
    bad = ckpts["root"] / f"bad-{case.replace(' ', '-')}"  # served at /files/bad-.../
    bad.mkdir()
    (bad / "config.json").write_text((ckpts["steps"][0] / "config.json").read_text())
    data = (ckpts["steps"][0] / "model.safetensors").read_bytes()
    n = int.from_bytes(data[:8], "little")
    want = {"no repo": "no repository org/none", "no revision": "has no revision 'step7'",
            "gated": "gated", "header longer than file":
            "claims .* bytes but the file holds", "tensor outside file": "outside the file", "redirect loop":
            "redirect loop", "truncated": "answered", "not found": "not found.*model.safetensors"}[case]
    if case == "no repo":
        args = ["org/none", "--remote"]
    elif case == "no revision":
        args += ["--revision", "step7"]
    elif case == "gated":
        srv.gated.add("org/llama")
    elif case == "header longer than file":
        (bad / "model.safetensors").write_bytes((len(data) + 10).to_bytes(8, "little") + data[8:])
        args = [f"{srv.url}/files/{bad.name}/"]
    elif case == "tensor outside file":
        (bad / "model.safetensors").write_bytes(data[: 8 + n + 100])  # the header names bytes beyond the end
        args = [f"{srv.url}/files/{bad.name}/"]
    elif case == "redirect loop":
        srv.loop = True
    elif case == "truncated":
        srv.fault = lambda path, start, end: "short" if start > 4096 else None
    elif case == "not found":
        args = [f"{srv.url}/files/{bad.name}/"]
    out = tmp_path / "o"
    res = CliRunner().invoke(app, ["spectra", *args, "--out", str(out), "-q"])
    lines = res.output.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), res.output
    assert re.search(want, lines[0]), lines[0]
    assert not out.exists() or not any(out.iterdir())


def test_offline_is_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HeadRankError, match="HF_HUB_OFFLINE"):
        analyze("org/llama", remote=True)
    with pytest.raises(HeadRankError, match="local path"):
        analyze("minilm", remote=True)


# -- rank over training, remotely -----------------------------------------------------------------
@pytest.mark.slow
def test_track_remote_revisions_all_resumes_and_records_failures(srv, ckpts, tmp_path):
    out = tmp_path / "t"
    res = track("org/pythia", out, revisions="all", remote=True, workers=1, plots=False)
    assert sorted(res.table["step"].unique()) == [0, 100, 200] and not res.failed  # main: no step, left out
    for step, d in ckpts["steps"].items():
        rows = res.table[res.table["step"] == step].drop(columns=["checkpoint", "step"])
        ref = analyze(d).table
        common = [c for c in ref.select_dtypes("number").columns if c in rows.columns]
        assert len(common) > 8
        np.testing.assert_array_equal(rows.sort_values(["layer", "product", "head"])[common].to_numpy(float),
                                      ref.sort_values(["layer", "product", "head"])[common].to_numpy(float))
    # a revision whose server keeps dropping: tried, recorded as failed, the others written; a re-run retries it
    out2 = tmp_path / "t2"
    sha = srv.commits[("org/pythia", "step100")]
    srv.fault = lambda path, start, end: "drop" if sha in path and start > 4096 else None
    res = CliRunner().invoke(app, ["track", "org/pythia", "--revisions", "step0,step100", "--remote", "--out",
                                   str(out2), "--workers", "1", "--no-plots", "-q"])
    assert res.exit_code == 1 and "failed: step100" in res.output, res.output
    series = json.loads((out2 / "series.json").read_text())
    assert list(series["failed"]) == ["step100"]
    assert sorted(pd.read_csv(out2 / "table.csv")["step"].unique()) == [0]
    srv.fault = None
    again = track("org/pythia", out2, revisions="step0,step100", remote=True, workers=1, plots=False)
    assert again.computed == ["step100"] and again.skipped == ["step0"] and not again.failed
    assert sorted(again.table["step"].unique()) == [0, 100]


def test_option_conflicts_are_one_line(srv, tmp_path):
    with pytest.raises(HeadRankError, match="`revision` applies to a Hugging Face Hub id, not to a URL"):
        analyze(f"{srv.url}/files/gpt2/", revision="main")
    with pytest.raises(HeadRankError, match="`download` and `remote` exclude each other"):
        analyze("org/llama", remote=True, download=True)
    with pytest.raises(HeadRankError, match="`remote` reads a Hugging Face Hub id"):
        analyze("not a repo id", remote=True)
    with pytest.raises(HeadRankError, match="`revisions` all lists the Hub's refs: add `remote`"):
        track("org/pythia", tmp_path / "t", revisions="all")
