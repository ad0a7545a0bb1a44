"""The attnrank command as a user meets it: real subprocesses, exit codes, files written."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

REQUIRED = ["layer", "head", "product", "sv_max", "nuclear", "frob_bound", "gap", "balance",
            "balance_rel", "rank", "effective_rank", "stable_rank"]


def run(*args, cwd=None):
    env = dict(os.environ, HF_HUB_OFFLINE="1", COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "attnrank", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300)


@pytest.mark.slow
def test_spectra_minilm_writes_everything(tmp_path):
    out = tmp_path / "out"
    r = run("spectra", "minilm", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "QK r/dh" in r.stdout
    heads = pd.read_csv(out / "heads.csv")
    assert set(REQUIRED) <= set(heads.columns) and len(heads) == 144
    npz = np.load(out / "spectra.npz")
    assert npz["qk"].shape == npz["ov"].shape == (6, 12, 32)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["model_type"] == "bert" and meta["tolerance"] == 1e-3
    assert meta["conventions"]["rotary"] is False and "ignored" in meta["conventions"]["biases"]
    for png in ("fig4_rows", "fig4_norms", "rank_heatmap", "singular_values"):
        assert (out / f"{png}.png").stat().st_size > 10_000
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temp files left


def test_json_summary():
    r = run("spectra", "minilm", "--json", "--layers", "0-1", "--tol", "0.01")
    assert r.returncode == 0, r.stderr
    payload = json.loads(r.stdout)
    assert [row["layer"] for row in payload["layers"]] == [0, 0, 1, 1]
    assert set(payload["overall"]) == {"qk", "ov"}
    assert payload["meta"]["tolerance"] == 0.01


@pytest.mark.parametrize("args, needle", [
    (["/no/such/dir"], "no such file"),
    (["minilm", "--tol", "3"], "tolerance"),
    (["minilm", "--tol", "nan"], "tolerance"),
    (["minilm", "--layers", "9"], "out of range"),
])
def test_bad_input_one_line_exit_2(args, needle):
    r = run("spectra", *args)
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr


def test_unsupported_model_type_exit_2(tmp_path, minilm_dir):
    shutil.copy(minilm_dir / "model.safetensors", tmp_path)
    cfg = json.loads((minilm_dir / "config.json").read_text()) | {"model_type": "mamba"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    r = run("spectra", str(tmp_path))
    assert r.returncode == 2 and "unsupported model_type 'mamba'" in r.stderr


def test_failed_run_keeps_earlier_output_intact(tmp_path, minilm_dir):
    out = tmp_path / "out"
    out.mkdir()
    (out / "heads.csv").write_text("precious\n")
    bad = tmp_path / "bad"
    bad.mkdir()
    shutil.copy(minilm_dir / "config.json", bad)
    data = (minilm_dir / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(data[: len(data) // 3])
    r = run("spectra", str(bad), "--out", str(out))
    assert r.returncode == 2 and "cannot read" in r.stderr
    assert (out / "heads.csv").read_text() == "precious\n"
    assert sorted(p.name for p in out.iterdir()) == ["heads.csv"]


class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_crafted_pickle_and_empty_dir_exit_2(tmp_path, minilm_dir):
    import pickle

    evil = tmp_path / "evil"
    evil.mkdir()
    shutil.copy(minilm_dir / "config.json", evil)
    marker = tmp_path / "pwned"
    (evil / "pytorch_model.bin").write_bytes(pickle.dumps({"w": _Exploit(str(marker))}))
    r = run("spectra", str(evil))
    assert r.returncode == 2 and "refused" in r.stderr and not marker.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    r = run("spectra", str(empty))
    assert r.returncode == 2 and "no weights" in r.stderr


def test_layout_file_option(tmp_path, minilm_dir):
    layout = tmp_path / "bert.toml"
    layout.write_text(
        'split = "separate"\n[tensors]\n'
        'q = "encoder.layer.{i}.attention.self.query.weight"\nk = "encoder.layer.{i}.attention.self.key.weight"\n'
        'v = "encoder.layer.{i}.attention.self.value.weight"\no = "encoder.layer.{i}.attention.output.dense.weight"\n'
        "[sizes]\nn_layers = 6\nd_model = 384\nn_heads = 12\n")
    r = run("spectra", str(minilm_dir / "model.safetensors"), "--layout", str(layout), "--json", "--layers", "5")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["meta"]["layout"]["name"] == "layout:bert.toml"
    layout.write_text('split = "sideways"\n')
    r = run("spectra", "minilm", "--layout", str(layout))
    assert r.returncode == 2 and "split must be one of" in r.stderr


def test_square_brackets_in_user_text_are_printed_as_they_are(tmp_path, minilm_dir):
    """Messages are not parsed as rich markup: a path with [/] or [red] is shown verbatim."""
    r = run("spectra", str(tmp_path / "no[/]such[red]dir"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "no[/]such[red]dir" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    src = tmp_path / "m[bold]x"
    shutil.copytree(minilm_dir, src)
    out = tmp_path / "o[red]y"
    r = run("spectra", str(src), "--out", str(out), "--no-plots", "--layers", "0")
    assert r.returncode == 0, r.stderr
    assert "m[bold]x" in r.stdout and "o[red]y" in r.stdout and (out / "heads.csv").exists()


# -- hostile inputs and failing file systems (issue 20) ------------------------------------------
def _one_error_line(r_code, err, needle=""):
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert r_code == 2 and "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err


@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])
def test_a_fifo_in_the_checkpoint_does_not_hang(tmp_path, name):
    from .fuzz.harness import write_tiny

    src = write_tiny(tmp_path / "m")
    (src / name).unlink()
    os.mkfifo(src / name)
    r = run("spectra", str(src))  # a hang would hit run()'s timeout
    _one_error_line(r.returncode, r.stderr, "is not a regular file (a FIFO)")


@pytest.mark.parametrize("args, needle", [
    (["spectra", "minilm", "--tol", "abc"], "Invalid value for '--tol'"),
    (["spectra"], "Missing argument"),
    (["spectra", "minilm", "--no-such-option"], "No such option"),
    (["spectra", "minilm", "--layers", "3-1"], "the range 3-1 is empty"),
    (["spectra", "minilm", "--layers", "0-1e20"], "--layers must look like"),
    (["spectra", "minilm", "--layers", "0-100000000000000000000"], "out of range"),
    (["train", "recall", "--out", "x", "--seed", "1e23"], "Invalid value for '--seed'"),
])
def test_usage_errors_are_one_line(tmp_path, monkeypatch, args, needle):
    from .fuzz.harness import run_cli

    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(*args)  # attnrank.cli.main in this process: the entry point's own handling
    _one_error_line(code, err, needle)
    assert not (tmp_path / "x").exists()


def test_a_usage_error_from_the_installed_command(tmp_path):
    r = run("spectra", "minilm", "--tol", "abc", cwd=tmp_path)
    _one_error_line(r.returncode, r.stderr, "Invalid value for '--tol'")


@pytest.mark.parametrize("command", ["spectra", "collapse", "scale"])
def test_out_is_checked_before_the_analysis(tmp_path, monkeypatch, command):
    from .fuzz.harness import run_cli, write_tiny

    def must_not_run(*a, **k):
        raise AssertionError("the analysis ran before --out was checked")

    for mod, fn in (("attnrank.analysis.scan", "analyze"), ("attnrank.analysis.collapse", "analyze"),
                    ("attnrank.analysis.scaling", "analyze_scaling")):
        monkeypatch.setattr(f"{mod}.{fn}", must_not_run)
    (tmp_path / "f").write_text("a file\n")
    src = write_tiny(tmp_path / "m")
    code, _, err = run_cli(command, str(src), "--out", str(tmp_path / "f" / "sub"))
    _one_error_line(code, err, "cannot create output directory")
    code, _, err = run_cli(command, str(src), "--out", str(tmp_path / "f"))
    _one_error_line(code, err, "exists and is not a directory")


def test_reproduce_checks_out_before_running(tmp_path):
    (tmp_path / "f").write_text("a file\n")
    r = run("reproduce", "fig1", "--quick", "--out", str(tmp_path / "f" / "sub"))
    _one_error_line(r.returncode, r.stderr, "cannot create output directory")


def test_a_full_disk_leaves_the_previous_set_whole(tmp_path, monkeypatch):
    import errno

    from .fuzz.harness import run_cli, snapshot, write_tiny

    src, out = write_tiny(tmp_path / "m"), tmp_path / "out"
    code, _, err = run_cli("spectra", str(src), "--out", str(out), "--no-plots", "--quiet", "--layers", "0")
    assert code == 0, err
    before = snapshot(out)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "savez_compressed", full)
    code, _, err = run_cli("spectra", str(src), "--out", str(out), "--no-plots", "--quiet")
    _one_error_line(code, err, "no space left on the device: cannot write")
    assert "spectra.npz" in err
    assert snapshot(out) == before  # the old heads.csv and meta.json, nothing new beside them


def test_temporaries_of_a_killed_run_are_cleaned(tmp_path):
    from attnrank.util.fileio import STAGING_PREFIX

    from .fuzz.harness import run_cli, write_tiny

    out = tmp_path / "out"
    out.mkdir()
    dead = 4_000_000  # above pid_max: a process that cannot be alive
    (out / f".fig4_rows.png.{dead}.a1b2c3d4.tmp.png").write_bytes(b"half a png")
    (out / f"{STAGING_PREFIX}{dead}-q1w2").mkdir()
    code, _, err = run_cli("spectra", str(write_tiny(tmp_path / "m")), "--out", str(out), "--no-plots", "--quiet")
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["heads.csv", "meta.json", "spectra.npz", "summary.csv"]


@pytest.mark.parametrize("exc, needle", [
    (OSError(5, "Input/output error", "/dev/sdz/model.safetensors"), "Input/output error: /dev/sdz/model.safetensors"),
    (MemoryError(), "out of memory"),
    (RecursionError(), "nested too deeply"),
])
def test_unforeseen_errors_are_still_one_line(tmp_path, monkeypatch, exc, needle):
    from .fuzz.harness import run_cli

    def fail(*a, **k):
        raise exc

    monkeypatch.setattr("attnrank.analysis.scan.analyze", fail)
    code, _, err = run_cli("spectra", "minilm")
    _one_error_line(code, err, needle)
