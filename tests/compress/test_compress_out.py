"""`compress --out` against the third red team (issue 46): every case goes through the one writer
(:mod:`headrank.io.writer`) and leaves nothing outside ``--out`` touched, nothing half-written, no
lock file behind. Each test failed on the code before the writer."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import transformers as tf
from typer.testing import CliRunner

from headrank.cli import app
from headrank.compress import compress

LLAMA = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
             vocab_size=64, head_dim=8)


@pytest.fixture(autouse=True)
def _baseline_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADRANK_CACHE", str(tmp_path / "headrank-cache"))


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("src") / "model"
    tf.LlamaForCausalLM(tf.LlamaConfig(**LLAMA)).save_pretrained(path)
    return path


def _digest(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file() and not p.is_symlink()}


def _cli(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, ["compress", *map(str, args)])
    return r.exit_code, r.output


def _one_line(code: int, out: str, *words: str) -> None:
    assert code == 2 and out.count("\n") == 1 and "Traceback" not in out, out
    assert all(w in out for w in words), out


def test_a_symlinked_lock_file_is_never_opened(src, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "out"
    compress(str(src), out, rank=4)
    (out / ".lock").symlink_to(victim)
    code, text = _cli(src, "--out", out, "--keep", "0.9")
    assert code == 0, text
    assert victim.read_text() == "precious\n" and (out / ".lock").is_symlink()


def test_a_symlinked_lock_under_train_resume_is_never_opened(tmp_path):
    from headrank.io.rundir import locked_run

    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".lock").symlink_to(victim)
    with locked_run(tmp_path / "run"):
        pass
    assert victim.read_text() == "precious\n"


def test_a_planted_compress_json_deletes_nothing(src, tmp_path):
    out = tmp_path / "out"
    compress(str(src), out, rank=4)
    (out / "precious.txt").write_text("mine")
    (out / "mydir").mkdir()
    (out / "mydir" / "work.txt").write_text("mine too")
    meta = json.loads((out / "compress.json").read_text())
    meta["files"] += ["precious.txt", "mydir/", "../outside.txt"]
    (out / "compress.json").write_text(json.dumps(meta))
    (tmp_path / "outside.txt").write_text("outside")
    compress(str(src), out, rank=2)
    assert (out / "precious.txt").read_text() == "mine" and (out / "mydir" / "work.txt").read_text() == "mine too"
    assert (tmp_path / "outside.txt").read_text() == "outside"


def test_a_planted_record_deletes_nothing_it_did_not_write(src, tmp_path):
    from headrank.io.writer import RECORD

    out = tmp_path / "out"
    compress(str(src), out, rank=4)
    (out / "precious.txt").write_text("mine")
    rec = json.loads((out / RECORD).read_text())
    rec["files"]["precious.txt"] = [4, "0" * 32]  # the right size, not the right fingerprint
    (out / RECORD).write_text(json.dumps(rec))
    compress(str(src), out, rank=2)
    assert (out / "precious.txt").read_text() == "mine"


@pytest.mark.parametrize("how", ["dense-output", "source-dir", "inside-source", "symlink-into-source"])
def test_out_that_is_or_is_inside_the_source_is_refused(src, tmp_path, how):
    if how == "dense-output":
        d = tmp_path / "d"
        compress(str(src), d, rank=4, format="dense")
        source, out = d, d
    else:
        source = tmp_path / "s"
        source.mkdir()
        for p in src.iterdir():
            (source / p.name).write_bytes(p.read_bytes())
        out = {"source-dir": source, "inside-source": source / "sub"}.get(how)
        if how == "symlink-into-source":
            out = tmp_path / "link"
            out.symlink_to(source)
    before = _digest(source)
    code, text = _cli(source, "--out", out, "--rank", "2")
    _one_line(code, text, "source")
    assert _digest(source) == before and not (source / "sub").exists()


def test_a_non_empty_foreign_directory_is_refused(src, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "thesis.tex").write_text("x")
    code, text = _cli(src, "--out", out, "--rank", "2")
    _one_line(code, text, "is not empty and holds no compress.json")
    assert [p.name for p in out.iterdir()] == ["thesis.tex"]


def test_side_directories_are_copied_without_following_links(src, tmp_path):
    s = tmp_path / "st"
    s.mkdir()
    for p in src.iterdir():
        (s / p.name).write_bytes(p.read_bytes())
    (tmp_path / "id_rsa").write_text("SECRET KEY")
    (s / "1_Pooling").mkdir()
    (s / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    (s / "1_Pooling" / "id_rsa").symlink_to(tmp_path / "id_rsa")
    (s / "1_Pooling" / "zero").symlink_to("/dev/zero")
    (s / "notes.txt").symlink_to(tmp_path / "id_rsa")
    res = compress(str(s), tmp_path / "out", rank=4)
    out = tmp_path / "out"
    assert (out / "1_Pooling" / "config.json").is_file()
    assert not (out / "1_Pooling" / "id_rsa").exists() and not (out / "1_Pooling" / "zero").exists()
    assert not (out / "notes.txt").exists()
    assert not any("SECRET" in p.read_text(errors="replace") for p in out.rglob("*") if p.is_file()
                   and p.stat().st_size < 2**20)
    assert any("not copied" in n and "id_rsa" in n for n in res["notes"]), res["notes"]


def test_no_lock_file_after_success_or_a_refusal(src, tmp_path):
    out = tmp_path / "out"
    assert _cli(src, "--out", out, "--rank", "2")[0] == 0
    assert not (out / ".lock").exists()
    assert _cli(src, "--out", out, "--rank", "9")[0] == 2  # above the head dim: refused
    assert not (out / ".lock").exists() and not any(p.name.startswith(".headrank-staging") for p in out.iterdir())


_ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def test_sigint_during_the_run_leaves_the_previous_set_and_no_lock(src, tmp_path):
    out = tmp_path / "out"
    compress(str(src), out, rank=4)
    before = _digest(out)
    code = textwrap.dedent(f"""
        import os, signal
        import headrank.compress.run as run
        real = run._write
        def interrupted(*a, **k):
            os.kill(os.getpid(), signal.SIGINT)
        run._write = interrupted
        run.compress({str(src)!r}, {str(out)!r}, rank=2)
    """)
    r = subprocess.run([sys.executable, "-c", code], env={**_ENV, "HEADRANK_CACHE": str(tmp_path / "c")},
                       capture_output=True, text=True, timeout=240)
    assert r.returncode != 0 and "KeyboardInterrupt" in r.stderr
    assert _digest(out) == before and not (out / ".lock").exists()
    assert not any(p.name.startswith(".headrank-staging") for p in out.iterdir())


def test_sigterm_during_the_final_move_leaves_one_whole_set(src, tmp_path):
    """The kill lands after the third rename of the commit: the set moves in whole (the signal is
    held until it is done), never old and new files side by side."""
    out = tmp_path / "out"
    compress(str(src), out, rank=4, format="dense")
    code = textwrap.dedent(f"""
        import os, signal
        real, n = os.replace, [0]
        def replace(a, b, **k):
            real(a, b, **k)
            if ".headrank-staging" in str(a) and ".previous-" not in str(b):
                n[0] += 1
                if n[0] == 3:
                    os.kill(os.getpid(), signal.SIGTERM)
        os.replace = replace
        import headrank
        headrank.compress({str(src)!r}, {str(out)!r}, rank=2)
    """)
    r = subprocess.run([sys.executable, "-c", code], env={**_ENV, "HEADRANK_CACHE": str(tmp_path / "c")},
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == -signal.SIGTERM, r.stderr[-2000:]
    meta = json.loads((out / "compress.json").read_text())
    assert meta["totals"]["mean_k"]["ov"] == 2.0  # the new set's record
    names = {p.name for p in out.iterdir() if not p.name.startswith(".")}
    assert names == {f.rstrip("/") for f in meta["files"]} | {"compress.json"}, names  # its files, and only those
    assert not (out / "model.safetensors").exists()  # the previous (dense) set's weights are gone


def test_two_runs_into_one_out_never_mix(src, tmp_path):
    """Run A is stopped (SIGSTOP) while it stages; run B into the same --out is refused in one
    line; A resumes and leaves exactly its set: no lock file, nothing of B."""
    out = tmp_path / "out"
    code = textwrap.dedent(f"""
        import os, signal, sys
        import headrank.compress.run as run
        real = run._write
        def paused(*a, **k):
            print("staging", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
            return real(*a, **k)
        run._write = paused
        run.compress({str(src)!r}, {str(out)!r}, rank=1)
    """)
    a = subprocess.Popen([sys.executable, "-c", code], env={**_ENV, "HEADRANK_CACHE": str(tmp_path / "c")},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert a.stdout.readline().strip() == "staging"
        code_b, text = _cli(src, "--out", out, "--rank", "6")
        _one_line(code_b, text, "another process", f"pid {a.pid}")
    finally:
        os.kill(a.pid, signal.SIGCONT)
        a.wait(240)
    assert a.returncode == 0, a.stderr.read()[-2000:]
    meta = json.loads((out / "compress.json").read_text())
    assert meta["totals"]["mean_k"]["ov"] == 1.0
    assert {p.name for p in out.iterdir()} == {f.rstrip("/") for f in meta["files"]} | {"compress.json", ".headrank-output.json"}
