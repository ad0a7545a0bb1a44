"""A checkpoint that changes while it is read (issue 46): truncated in place or replaced by rename
while `spectra` or `track` reads it is one line, exit 2, nothing written; a re-run does not
reuse a table measured from the checkpoint a rename replaced. One mechanism
(:mod:`headrank.io.identity`): each file's identity at open, checked after the last read and
before the commit.

The change is made by a hook in the fresh interpreters that run the CLI (``HOOK``): after the
scan has read its last layer (the moment the old code never looked at), after the first layer
(a rename then: the open descriptor still reads the old file to the end), or while the output
is staged (the writer's check before its commit)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from headrank.errors import HeadRankError
from tests.helpers import track_stopped_after_first

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=48, vocab_size=50)

# a sitecustomize.py on PYTHONPATH, so every interpreter of the run has it (track's spawned workers
# too): it truncates (or replaces by rename) the model.safetensors of each checkpoint the scan reads,
# once, when the scan has read layer AT (AT 0: while the output is staged, after the analysis)
HOOK = r'''
import os, shutil
from pathlib import Path

def _install(action, at):
    from headrank.analysis import scan

    real, real_save, done_with = scan._scan_layers, scan.save, set()

    def change(target):
        if target in done_with or not os.path.exists(target):
            return
        done_with.add(target)
        if action == "truncate":  # in place: the same inode, shorter
            with open(target, "r+b") as fh:
                fh.truncate(os.path.getsize(target) // 2)
        else:  # replaced by rename: the same bytes, size and times in another inode
            shutil.copy2(target, target + ".new")
            os.replace(target + ".new", target)

    def scan_layers(reader, sel, tol, threads, rot, vecs, progress, *a, **k):
        def step(done, total):
            if done == at:
                change(str(Path(reader.ckpt.path) / "model.safetensors"))
            if progress:
                progress(done, total)
        return real(reader, sel, tol, threads, rot, vecs, step, *a, **k)

    def save(result, out, **k):
        if at == 0:
            change(str(Path(result.meta["path"]) / "model.safetensors"))
        return real_save(result, out, **k)

    scan._scan_layers, scan.save = scan_layers, save

if os.environ.get("IDENTITY_TEST_CHANGE"):
    _action, _at = os.environ["IDENTITY_TEST_CHANGE"].split(",")
    _install(_action, int(_at))
'''


def _llama(path: Path, seed: int = 0) -> Path:
    import torch
    import transformers as tf

    torch.manual_seed(seed)
    tf.LlamaForCausalLM(tf.LlamaConfig(**SMALL)).save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("identity")
    return [_llama(root / f"step-{s}", seed=s) for s in (1, 2)]


def _fresh(models, tmp_path) -> list[Path]:
    out = []
    for m in models:
        shutil.copytree(m, tmp_path / "in" / m.name)
        out.append(tmp_path / "in" / m.name)
    return out


def _run(tmp_path, action: str, at: int, *args: str) -> subprocess.CompletedProcess:
    hook = tmp_path / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(HOOK)
    path = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": path, "IDENTITY_TEST_CHANGE": f"{action},{at}"}
    return subprocess.run([sys.executable, "-m", "headrank", *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=env)


def _one_line_2(r: subprocess.CompletedProcess, target: Path) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, (r.returncode, r.stderr[-2000:])
    assert f"{target.name} changed while it was read" in lines[0], lines[0]
    return lines[0]


# -- spectra -------------------------------------------------------------------------------------
@pytest.mark.parametrize("action, at", [("truncate", 2), ("rename", 1), ("rename", 0)])  # last layer, first, staging
def test_spectra_of_a_checkpoint_changed_while_read_writes_nothing(models, tmp_path, action, at):
    src = _fresh(models[:1], tmp_path)[0]
    target = src / "model.safetensors"
    r = _run(tmp_path, action, at, "spectra", f"in/{src.name}", "--out", "out dir", "-q")
    _one_line_2(r, target)
    assert not (tmp_path / "out dir").exists()  # created for the run, removed with nothing in it


def test_spectra_over_an_earlier_output_leaves_it_whole(models, tmp_path):
    src = _fresh(models[:1], tmp_path)[0]
    first = subprocess.run([sys.executable, "-m", "headrank", "spectra", str(src), "--out", "o", "-q", "--no-plots"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    before = {p.name: p.read_bytes() for p in (tmp_path / "o").iterdir()}
    r = _run(tmp_path, "rename", 1, "spectra", str(src), "--out", "o", "-q", "--no-plots")
    _one_line_2(r, src / "model.safetensors")
    assert {p.name: p.read_bytes() for p in (tmp_path / "o").iterdir()} == before


# -- track ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("action, at, workers", [("truncate", 2, 1), ("rename", 1, 1), ("rename", 1, 2)])
def test_track_of_a_checkpoint_changed_while_read_writes_nothing(models, tmp_path, action, at, workers):
    srcs = _fresh(models, tmp_path)  # both change
    target = srcs[0] / "model.safetensors"
    r = _run(tmp_path, action, at, "track", *[f"in/{s.name}" for s in srcs], "--out", "t",
             "--workers", str(workers), "--no-plots", "-q")
    line = _one_line_2(r, target)
    assert "every checkpoint failed" in line
    assert not (tmp_path / "t" / "table.csv").exists() and not list((tmp_path / "t").glob("checkpoints/*.csv"))


def test_track_records_the_changed_checkpoint_and_writes_the_other(models, tmp_path):
    """Two checkpoints, one replaced by rename while it is read (the other's weights file has a
    name the driver leaves alone): the changed one is recorded as failed with the one line,
    exit 1 (README: a failing checkpoint is recorded, the others written)."""
    srcs = _fresh(models, tmp_path)
    target = srcs[0] / "model.safetensors"
    os.rename(srcs[1] / "model.safetensors", srcs[1] / "weights.safetensors")  # not the driver's file name
    r = _run(tmp_path, "rename", 1, "track", *[f"in/{s.name}" for s in srcs], "--out", "t",
             "--workers", "1", "--no-plots", "-q")
    assert r.returncode == 1, r.stderr
    assert f"{target.name} changed while it was read" in r.stderr
    import pandas as pd

    table = pd.read_csv(tmp_path / "t" / "table.csv")
    assert set(table["checkpoint"]) == {srcs[1].name}


def test_track_resume_after_a_rename_measures_anew_or_refuses(models, tmp_path):
    """A run stopped after its first checkpoint; that checkpoint is replaced by rename (same
    bytes, size and times); `--resume` does not reuse its table: one line naming it; without
    `--resume` the finished series is refused too, and `--force` measures it anew."""
    from headrank.analysis.series import track

    srcs = _fresh(models, tmp_path)
    out = tmp_path / "t"

    track_stopped_after_first([str(s) for s in srcs], out)
    measured = [p.stem for p in (out / "checkpoints").glob("*.csv")]
    assert len(measured) == 1
    f = tmp_path / "in" / measured[0] / "model.safetensors"
    shutil.copy2(f, f.with_name("x.tmp"))
    os.replace(f.with_name("x.tmp"), f)
    r = subprocess.run([sys.executable, "-m", "headrank", "track", *map(str, srcs), "--out", str(out), "--resume",
                        "--workers", "1", "--no-plots", "-q"], capture_output=True, text=True, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and f"checkpoint {measured[0]}" in lines[0] and \
        "changed since the run started" in lines[0], r.stderr
    res = track([str(s) for s in srcs], out, workers=1, plots=False, force=True)
    assert sorted(res.computed) == sorted(s.name for s in srcs)


# -- the mechanism ---------------------------------------------------------------------------------
def test_stamps_see_truncation_rewrite_rename_and_deletion(tmp_path):
    from headrank.io.identity import Stamps, changed

    f = tmp_path / "w.bin"

    def fresh():
        f.write_bytes(b"x" * 100)
        st = Stamps(tmp_path)
        st.add(f)
        st.check()  # unchanged
        return st

    for change in (lambda: os.truncate(f, 10),
                   lambda: os.utime(f, ns=(0, 123)),  # rewritten in place: the time moved
                   lambda: (shutil.copy2(f, tmp_path / "n"), os.replace(tmp_path / "n", f)),  # another inode
                   lambda: f.unlink()):
        st = fresh()
        print_before = st.fingerprint()
        change()
        with pytest.raises(HeadRankError, match=r"w\.bin changed while it was read"):
            st.check()
        if f.exists():
            again = Stamps(tmp_path)
            again.add(f)
            assert again.fingerprint() != print_before
    assert "nothing was written" in str(changed(f))


def test_the_writer_does_not_commit_after_an_input_changed(tmp_path):
    from headrank.io.identity import Stamps
    from headrank.io.writer import OutputSet

    f = tmp_path / "w.bin"
    f.write_bytes(b"x" * 100)
    st = Stamps(tmp_path)
    st.add(f)
    with pytest.raises(HeadRankError, match="changed while it was read"), OutputSet(tmp_path / "o") as dest:
        dest.watch(st)
        with dest.stage() as stage:
            (stage / "a.csv").write_text("1\n")
            os.truncate(f, 1)  # after the last file is staged, before the commit
    assert not (tmp_path / "o").exists()


def test_a_reader_records_every_weight_file_and_the_config(models, tmp_path):
    from headrank.io.checkpoint import Checkpoint
    from tests.helpers import shard

    sharded = tmp_path / "sharded"
    shard(models[0], sharded, n_shards=2)
    with Checkpoint(sharded) as ck:
        assert len(ck.stamps) == 3  # two shards and config.json
        ident = ck.identity()
        ck.check_unchanged()
    shard_file = sorted(sharded.glob("*.safetensors"))[1]
    shutil.copy2(shard_file, tmp_path / "n")
    os.replace(tmp_path / "n", shard_file)
    with Checkpoint(sharded) as ck:
        assert ck.identity() != ident


def test_a_path_through_a_symlink_and_dotdot_is_the_file_opened_not_a_changed_one(tmp_path, minilm_dir):
    """``lnk/../m`` with ``lnk`` a symlink names the sibling of lnk's target (as the open follows
    it); os.path.abspath dropped ``lnk/..`` by its spelling and checked another path, so an
    unchanged checkpoint was refused as 'changed while it was read' (exit 2). Read in a fresh
    interpreter, relative path, cwd elsewhere: exit 0 and written."""
    (tmp_path / "real" / "sub").mkdir(parents=True)
    shutil.copytree(minilm_dir, tmp_path / "real" / "m")
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "lnk").symlink_to(tmp_path / "real" / "sub")
    r = subprocess.run([sys.executable, "-m", "headrank", "spectra", "x/lnk/../m", "--layers", "0", "--out", "o d"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "o d" / "heads.csv").is_file()
