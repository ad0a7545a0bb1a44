"""Paths as users type them: every verb that writes, run from a working directory of its own with
a relative ``--out`` (spaces and non-ASCII in the names, reached through a symlinked directory),
``~``, the current directory's parent; and ``--out`` values that cannot be written (a file, a
read-only file system). The figures are checked too: a relative ``--out`` once broke on them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "attnrank_outputs"
TINY_TRAIN = ("--steps", "4", "--n-layers", "1", "--d-model", "16", "--n-heads", "2", "--batch-size", "4",
              "--checkpoint-every", "2", "--track-every", "2", "--log", "none")
# verb -> (arguments before --out, files that must be there afterwards); "run" is a recall run in the cwd
VERBS = {
    "spectra": (("spectra", "minilm"), ("heads.csv", "meta.json", "singular_values.png", "fig4_norms.png")),
    "collapse": (("collapse", "minilm", "--seqs", "2", "--max-tokens", "8"), ("layers.csv", "collapse_layers.png")),
    "scale": (("scale", "minilm", "--scales", "2", "--no-pairs"), ("tensors.csv", "scale_tensors.png")),
    "compress": (("compress", "minilm", "--rank", "4", "--products", "ov"), ("compress.json", "config.json")),
    "train": (("train", "recall", *TINY_TRAIN), ("config.json", "metrics.jsonl", "summary.json")),
    "track": (("track", "run"), ("table.csv", "series.json", "over_training.png")),
    "sweep": (("sweep", "recall", "--grid", "attn_weight_decay=0,0.1", "--set", "steps=2", "--set", "n_layers=1",
               "--set", "d_model=16", "--set", "n_heads=2", "--set", "batch_size=4", "--seeds", "0"),
              ("runs.csv", "summary.csv")),
    "reproduce": (("reproduce", "fig1", "--quick"), ("claims.json", "report.html", "fig1.png")),
}
FAST = {"spectra", "train", "track"}


def headrank(*args: str, cwd: Path, home: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **({"HOME": str(home)} if home else {})}
    return subprocess.run([sys.executable, "-m", "headrank", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)


@pytest.fixture()
def workdir(tmp_path: Path) -> Path:
    """tmp/"wö rk dir"/sub reached through the symlink tmp/link, with a recall run in it."""
    real = tmp_path / "wö rk dir" / "sub"
    real.mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "wö rk dir", target_is_directory=True)
    shutil.copytree(FIXTURE / "run", real / "run")
    return tmp_path / "link" / "sub"


@pytest.mark.parametrize("verb", [pytest.param(v, marks=() if v in FAST else pytest.mark.slow) for v in VERBS])
def test_a_relative_out_from_another_directory(workdir, verb):
    args, files = VERBS[verb]
    out = "../out ü/" + verb  # relative, a space, non-ASCII, through the symlinked parent
    r = headrank(*args, "--out", out, "-q", cwd=workdir)
    assert r.returncode == 0, r.stderr
    where = workdir.parent / "out ü" / verb
    for f in files:
        assert (where / f).is_file(), f"{verb}: {f} missing in {sorted(p.name for p in where.iterdir())}"
    assert not [p for p in where.iterdir() if p.name.startswith(".headrank-staging-")]
    assert not (workdir / "~").exists()


@pytest.mark.slow
def test_the_messages_name_the_out_the_user_gave(workdir):
    r = headrank("spectra", "minilm", "--out", "../mine", cwd=workdir)
    assert r.returncode == 0, r.stderr
    assert "to ../mine:" in r.stdout + r.stderr


@pytest.mark.slow
def test_tilde_and_the_parent_directory(workdir, tmp_path):
    home = tmp_path / "home dir"
    home.mkdir()
    for out in ("~/res", "--out=~/res2"):
        args = ("--out", out) if not out.startswith("--") else (out,)
        r = headrank("spectra", "minilm", *args, "-q", cwd=workdir, home=home)
        assert r.returncode == 0, r.stderr
    assert (home / "res" / "heads.csv").is_file() and (home / "res2" / "heads.csv").is_file()
    r = headrank("spectra", "minilm", "--out", "..", "-q", cwd=workdir)  # the cwd's parent, not empty
    assert r.returncode == 0, r.stderr
    assert (workdir.parent / "heads.csv").is_file() and (workdir / "run" / "config.json").is_file()
    r = headrank("spectra", "minilm", "--out", ".", "-q", cwd=workdir / "run")  # the cwd itself
    assert r.returncode == 0, r.stderr
    assert (workdir / "run" / "singular_values.png").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("verb", ["spectra", "train", "compress", "reproduce"])
def test_an_out_that_is_a_file_is_one_line(workdir, verb):
    args, _ = VERBS[verb]
    (workdir / "taken").write_text("keep me\n")
    r = headrank(*args, "--out", "taken", "-q", cwd=workdir)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "taken" in r.stderr and "Traceback" not in r.stderr
    assert (workdir / "taken").read_text() == "keep me\n"


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to mount a tmpfs")
@pytest.mark.parametrize("verb", ["spectra", "train", "collapse", "reproduce"])
def test_a_read_only_file_system_is_one_line(tmp_path, verb):
    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        args, _ = VERBS[verb]
        r = headrank(*args, "--out", "ro/x", "-q", cwd=tmp_path)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "ro/x" in r.stderr and "Traceback" not in r.stderr
    finally:
        subprocess.run(["umount", str(ro)], capture_output=True)


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root may write anywhere")
def test_an_out_the_user_cannot_write_is_one_line(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    r = headrank("spectra", "minilm", "--out", "locked/x", "-q", cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
