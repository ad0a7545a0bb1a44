"""The headrank command as a user meets it: real subprocesses, exit codes, files written."""

import io
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
    return subprocess.run([sys.executable, "-m", "headrank", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300)


@pytest.mark.slow
def test_spectra_minilm_writes_everything(tmp_path):
    out = tmp_path / "out"
    r = run("spectra", "minilm", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "QK eff" in r.stdout and "QK k90" in r.stdout  # the console leads with what moves
    heads = pd.read_csv(out / "heads.csv")
    assert set(REQUIRED) <= set(heads.columns) and len(heads) == 144
    assert {"k90", "k99", "gap_rel"} <= set(pd.read_csv(out / "summary.csv").columns) <= set(heads.columns) | {
        "heads", "rank_frac"}
    npz = np.load(out / "spectra.npz")
    assert npz["qk"].shape == npz["ov"].shape == (6, 12, 32)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["model_type"] == "bert" and meta["tolerance"] == 1e-3
    assert meta["conventions"]["rotary"] is False and "ignored" in meta["conventions"]["biases"]
    for png in ("fig4_rows", "fig4_norms", "rank_heatmap", "singular_values"):
        assert (out / f"{png}.png").stat().st_size > 10_000
    assert not [p for p in out.iterdir() if p.name.startswith(".") and p.name != ".headrank-output.json"]  # no temp files left


def test_json_summary():
    r = run("spectra", "minilm", "--json", "--layers", "0-1", "--tol", "0.01")
    assert r.returncode == 0, r.stderr
    payload = json.loads(r.stdout)
    assert [row["layer"] for row in payload["layers"]] == [0, 0, 1, 1]
    assert set(payload["overall"]) == {"qk", "ov"}
    assert payload["meta"]["tolerance"] == 0.01


@pytest.mark.parametrize("args, needle", [
    (["/no/such/dir"], "no such file"),
    (["minilm", "--tol", "3"], "--tol must lie in (0, 1)"),  # the flag named, as typed
    (["minilm", "--tol", "nan"], "--tol"),
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
    r = run("spectra", str(tmp_path))  # refused with the reason discovery recorded for it
    assert r.returncode == 2 and "model type 'mamba' is refused: no softmax attention" in r.stderr
    cfg["model_type"] = "no_such_model"  # a type transformers does not know
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    r = run("spectra", str(tmp_path))
    assert r.returncode == 2 and "no_such_model" in r.stderr and len(r.stderr.strip().splitlines()) == 1


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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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
    code, _, err = run_cli(*args)  # headrank.cli.main in this process: the entry point's own handling
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

    for mod, fn in (("headrank.analysis.scan", "analyze"), ("headrank.analysis.collapse", "analyze"),
                    ("headrank.analysis.scaling", "analyze_scaling")):
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
    from headrank.util.fileio import STAGING_PREFIX

    from .fuzz.harness import run_cli, write_tiny

    out = tmp_path / "out"
    out.mkdir()
    dead = 4_000_000  # above pid_max: a process that cannot be alive
    (out / f".fig4_rows.png.{dead}.a1b2c3d4.tmp.png").write_bytes(b"half a png")
    (out / f"{STAGING_PREFIX}{dead}-q1w2").mkdir()
    code, _, err = run_cli("spectra", str(write_tiny(tmp_path / "m")), "--out", str(out), "--no-plots", "--quiet")
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == [".headrank-output.json", "heads.csv", "meta.json", "spectra.npz",
                                                     "summary.csv"]


@pytest.mark.parametrize("exc, needle", [
    (OSError(5, "Input/output error", "/dev/sdz/model.safetensors"), "Input/output error: /dev/sdz/model.safetensors"),
    (MemoryError(), "out of memory"),
    (RecursionError(), "nested too deeply"),
])
def test_unforeseen_errors_are_still_one_line(tmp_path, monkeypatch, exc, needle):
    from .fuzz.harness import run_cli

    def fail(*a, **k):
        raise exc

    monkeypatch.setattr("headrank.analysis.scan.analyze", fail)
    code, _, err = run_cli("spectra", "minilm")
    _one_error_line(code, err, needle)


# -- the one error path (issue 27) -------------------------------------------------------------
def test_no_private_typer_or_click_imports():
    """typer 0.29 vendors click as typer._click: only public names (typer.TyperException, ...)."""
    import ast
    from pathlib import Path

    import headrank

    for f in Path(headrank.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for n in names:
                assert not n.startswith(("typer._", "click._")), f"{f}: imports {n}"


def _raise(exc):
    def fail(*a, **k):
        raise exc
    return fail


def test_an_unexpected_exception_is_one_line_naming_debug(monkeypatch):
    from .fuzz.harness import run_cli

    monkeypatch.delenv("HEADRANK_DEBUG", raising=False)
    monkeypatch.setattr("headrank.analysis.scan.analyze", _raise(RuntimeError("shape '[4, -1, 2]' is invalid\nfor input")))
    code, _, err = run_cli("spectra", "minilm")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 1 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("error: unexpected RuntimeError: shape '[4, -1, 2]' is invalid for input")
    assert "--debug" in lines[0] and "HEADRANK_DEBUG=1" in lines[0]


@pytest.mark.parametrize("how", ["option", "env"])
def test_debug_shows_the_traceback(monkeypatch, how):
    from headrank import cli

    monkeypatch.setattr("headrank.analysis.scan.analyze", _raise(ZeroDivisionError("deep inside")))
    monkeypatch.setattr(sys, "argv", ["headrank", *(["--debug"] if how == "option" else []), "spectra", "minilm"])
    if how == "env":
        monkeypatch.setenv("HEADRANK_DEBUG", "1")
    with pytest.raises(ZeroDivisionError, match="deep inside"):
        cli.main()


def test_ctrl_c_prints_interrupted_exit_130(monkeypatch):
    import signal

    from .fuzz.harness import run_cli

    monkeypatch.setattr("headrank.analysis.scan.analyze", _raise(KeyboardInterrupt()))
    before = signal.getsignal(signal.SIGINT)
    code, _, err = run_cli("spectra", "minilm")
    assert code == 130 and err.strip() == "error: interrupted", err
    assert signal.getsignal(signal.SIGINT) == before  # an in-process caller keeps its own handler


def _maps(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/maps") as fh:
            return fh.read()
    except OSError:
        return ""


@pytest.mark.slow
@pytest.mark.parametrize("when", ["importing torch", "training"])
def test_sigint_to_a_running_command(tmp_path, when):
    """A real SIGINT to `headrank train`, while the command imports torch (its shared library
    mapped, the import not finished: a KeyboardInterrupt there used to turn into an ImportError or
    an exit by signal) or while it trains: one line, exit 130, no traceback. The test waits on
    events (a mapped library, a metrics file), never on a fixed sleep."""
    import signal
    import time

    if when == "importing torch" and not os.path.exists(f"/proc/{os.getpid()}/maps"):
        pytest.skip("needs /proc")
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    p = subprocess.Popen([sys.executable, "-m", "headrank", "train", "recall", "--out", str(tmp_path / "r"),
                          "--steps", "100000", "--quiet", "--log", "none"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    event = ((lambda: "libtorch" in _maps(p.pid)) if when == "importing torch" else
             (lambda: (tmp_path / "r" / "metrics.jsonl").exists()))
    deadline = time.monotonic() + 300
    while not event() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert p.poll() is None, "the command ended before the event"
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and err.strip() == "error: interrupted", (p.returncode, err[-2000:])


@pytest.mark.slow
@pytest.mark.parametrize("after", ["headrank.cli.common", "headrank.cli.train"])
def test_sigint_while_the_command_line_starts(tmp_path, after):
    """A real SIGINT while the command-line modules are imported (the event: ``-X importtime``'s
    line for a module, printed as its import ends): one line, exit 130, no traceback."""
    import re
    import signal

    env = dict(os.environ, HF_HUB_OFFLINE="1")
    p = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "headrank", "train", "recall", "--out",
                          str(tmp_path / "r"), "--steps", "100000", "--quiet", "--log", "none"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    seen = False
    for line in p.stderr:
        if re.search(rf"\|\s+{re.escape(after)}$", line.rstrip()):
            seen = True
            break
    assert seen and p.poll() is None, "the import of the milestone was not seen while the command ran"
    p.send_signal(signal.SIGINT)
    out, rest = p.communicate(timeout=60)
    lines = [ln for ln in rest.splitlines() if ln.strip() and not ln.startswith("import time:")]
    assert p.returncode == 130 and lines == ["error: interrupted"], (p.returncode, rest[-2000:])


def test_interrupts_watchdog_ends_a_command_that_swallows_ctrl_c():
    """A KeyboardInterrupt swallowed (raised inside a __del__, which Python only prints): the
    watchdog reports and exits 130 after the grace period; the line is printed once."""
    code = (
        "import sys, time\n"
        "from headrank.cli.errorpath import Interrupts\n"
        "it = Interrupts(lambda m: sys.stderr.write('error: ' + m + '\\n'), grace_s=0.5)\n"
        "try:\n"
        "    it.handler(2, None)  # what a SIGINT runs\n"
        "except KeyboardInterrupt:\n"
        "    pass  # swallowed, as inside a __del__\n"
        "time.sleep(60)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    err = p.stderr
    assert p.returncode == 130 and err.strip() == "error: interrupted", err


def test_a_closed_stdout_is_quiet(tmp_path):
    """`headrank spectra M --format csv | head -1`: no "Broken pipe" line, no traceback."""
    from .fuzz.harness import write_tiny

    src = write_tiny(tmp_path / "m")
    cmd = (f"{sys.executable} -m headrank spectra {src} --format csv; echo rc=$? >&2")
    for reader in ("head -c 10",):
        r = subprocess.run(f"({cmd}) | {reader}", shell=True, capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, HF_HUB_OFFLINE="1"))
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert lines in (["rc=141"], ["rc=0"]), r.stderr  # 0: everything fit in the pipe first


def test_line_progress_when_stderr_is_not_a_terminal():
    from rich.console import Console

    from headrank.util.progress import LineProgress

    t = [0.0]
    con = Console(file=io.StringIO(), width=200)
    with LineProgress(con, every_s=10, clock=lambda: t[0]) as bar:
        task = bar.add_task("layers", total=None)
        for i in range(1, 7):
            t[0] += 4
            bar.update(task, completed=i, total=6, info=f"loss {i}")
    assert con.file.getvalue().splitlines() == ["layers 3/6  loss 3 (12 s)", "layers 6/6  loss 6 (24 s)"]
    con = Console(file=io.StringIO(), width=200)  # quick: nothing at all
    with LineProgress(con, every_s=10, clock=lambda: 0.0) as bar:
        task = bar.add_task("layers", total=3)
        for i in range(1, 4):
            bar.update(task, completed=i)
    assert con.file.getvalue() == ""


# -- issue 27: every red-team cause is one line, exit 2, nothing left behind -----------------------
def _hf_like_minilm(tmp_path, minilm_dir, **changes):
    d = tmp_path / "big"
    d.mkdir()
    cfg = json.loads((minilm_dir / "config.json").read_text()) | changes
    (d / "config.json").write_text(json.dumps(cfg))
    shutil.copy(minilm_dir / "model.safetensors", d)
    return d


@pytest.mark.parametrize("args, needle", [
    (["train", "lm", "--d-model", "100000"], "a model of 480,057,600,000 parameters (d_model 100000, 4 layers"),
    (["train", "lm", "--n-layers", "100000", "--d-model", "4096"], "parameters (d_model 4096, 100000 layers"),
    (["train", "vit", "--image-size", "100000"], "--image-size 100000: 1797 images of 100000x100000 pixels"),
    (["train", "lm", "--tokenizer", "bpe", "--bpe-vocab", "1000000000"], "bpe_vocab must be at most 1048576"),
    (["train", "recall", "--threads", "1000000"], "threads must lie in 1.."),
    (["sweep", "recall", "--workers", "10000000000"], "workers must lie in 1.."),
    (["sweep", "recall", "--threads", "1000000"], "threads must lie in 1.."),
    (["sweep", "recall", "--set", "model=5"], "'model' is not a field to set or sweep"),
    (["sweep", "recall", "--set", "task=5"], "'task' is not a field to set or sweep"),
])
def test_sizes_threads_and_fields_refused_before_anything_is_written(tmp_path, monkeypatch, args, needle):
    from .fuzz.harness import check_outcome, run_cli

    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(*args, "--out", str(tmp_path / "o"), "--quiet")
    check_outcome(code, err)
    assert code == 2 and needle in err, err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("spec, needle", [
    ('{"kind": "recall", "seeds": 5}', "seeds must be a list of integers"),
    ('{"kind": "recall", "base": "ab"}', "base must be a table of FIELD = value"),
    ('{"kind": "recall", "grid": [1, 2]}', "grid must be a table of FIELD = [values]"),
    ('{"kind": ["recall"]}', "kind must be a string"),
    ('{"kind": "recall", "grid": {"model": [1]}}', "'model' is not a field to set or sweep"),
    ('kind = "recall"\n[grid]\nattn_weight_decay = [{a = 1}]\n', "values must be numbers, bools or strings"),
    ('kind = "recall"\n[grid.attn_weight_decay]\na = 1\n', "needs a non-empty list of values"),
    ('kind = "recall"\n[base]\nsteps = [1, 2]\n', "base field 'steps' must be a number"),
])
def test_sweep_specs_with_wrong_types(tmp_path, monkeypatch, spec, needle):
    from .fuzz.harness import check_outcome, run_cli

    monkeypatch.chdir(tmp_path)
    f = tmp_path / ("spec.toml" if spec.startswith("kind") else "spec.json")
    f.write_text(spec)
    code, _, err = run_cli("sweep", str(f), "--out", str(tmp_path / "o"), "--quiet")
    check_outcome(code, err)
    assert code == 2 and needle in err, err
    assert not (tmp_path / "o").exists()


WIDE = {"hidden_size": 12000, "intermediate_size": 48000, "num_hidden_layers": 1}


@pytest.mark.slow
@pytest.mark.parametrize("command, changes, needle", [
    ("collapse", {"vocab_size": 10**12}, "vocab_size must lie in 1..4194304; got 1000000000000"),  # bounded first
    ("collapse", WIDE, "a model of 2,244,625,024"),
    ("scale", WIDE, "a model of 2,244,625,024"),
])
def test_models_too_big_for_this_machine_are_refused_before_they_are_built(tmp_path, minilm_dir, command,
                                                                            changes, needle):
    from .fuzz.harness import check_outcome, run_cli

    src = _hf_like_minilm(tmp_path, minilm_dir, **changes)
    code, _, err = run_cli(command, str(src), "--out", str(tmp_path / "o"), "--quiet")
    check_outcome(code, err)
    assert code == 2 and needle in err and ("GiB of memory; this machine has" in err or "must lie in" in err), err
    assert not (tmp_path / "o").exists()


@pytest.fixture(scope="module")
def recall_run(tmp_path_factory):
    from .fuzz.harness import run_cli

    run = tmp_path_factory.mktemp("recall") / "r"
    code, _, err = run_cli("train", "recall", "--out", str(run), "--steps", "4", "--checkpoint-every", "2",
                           "--quiet", "--log", "none")
    assert code == 0, err
    return run


@pytest.mark.parametrize("breakage, needle", [
    (lambda st: st.pop("optimizer"), "has no 'optimizer': not a complete training state"),
    (lambda st: st.update(step="4"), "'step' must be int, got str '4'"),
    (lambda st: st.update(optimizer={"state": 5}), "'optimizer' is not an optimizer state"),
])
def test_a_broken_state_pt_is_one_line(tmp_path, recall_run, breakage, needle):
    import torch

    from .fuzz.harness import check_outcome, run_cli

    run = tmp_path / "r"
    shutil.copytree(recall_run, run)
    for ck in (run / "checkpoints").iterdir():
        st = torch.load(ck / "state.pt", weights_only=True)
        breakage(st)
        torch.save(st, ck / "state.pt")
    code, _, err = run_cli("train", "recall", "--out", str(run), "--steps", "6", "--checkpoint-every", "2",
                           "--quiet", "--log", "none", "--resume")
    check_outcome(code, err)
    assert code == 2 and needle in err, err


def test_a_full_disk_while_saving_a_checkpoint(tmp_path, monkeypatch):
    """ENOSPC while writing state.pt: one "no space" line (torch's own zip writer said
    "unexpected pos"), and no half-written checkpoint directory."""
    import builtins
    import errno

    from .fuzz.harness import check_outcome, run_cli

    real_open = builtins.open

    def full_open(file, mode="r", *a, **k):
        if str(file).endswith("state.pt") and "w" in mode:
            raise OSError(errno.ENOSPC, "No space left on device", str(file))
        return real_open(file, mode, *a, **k)

    monkeypatch.setattr("headrank.training.state.open", full_open, raising=False)
    code, _, err = run_cli("train", "recall", "--out", str(tmp_path / "r"), "--steps", "2",
                           "--checkpoint-every", "2", "--quiet", "--log", "none")
    check_outcome(code, err)
    assert code == 2 and "no space left on the device: cannot write the checkpoint" in err, err
    assert not [p for p in (tmp_path / "r" / "checkpoints").iterdir()]


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to mount a small tmpfs")
def test_a_really_full_disk_while_saving_a_checkpoint(tmp_path):
    """The real thing, where a tmpfs can be mounted: a file system too small for the checkpoint."""
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(small)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        from .fuzz.harness import run_cli

        code, _, err = run_cli("train", "recall", "--out", str(small / "r"), "--steps", "2", "--checkpoint-every",
                               "2", "--quiet", "--log", "none")
        _one_error_line(code, err, "no space left on the device: cannot write the checkpoint")
        assert not [p for p in (small / "r" / "checkpoints").iterdir() if p.name.startswith(".") and p.name != ".headrank-output.json"]
    finally:
        subprocess.run(["umount", str(small)], capture_output=True)


def test_replot_data_json_that_is_a_fifo(tmp_path):
    from .fuzz.harness import check_outcome, run_cli

    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "run.json").write_text('{"name": "fig1", "quick": true}')
    os.mkfifo(tmp_path / "o" / "data.json")
    code, _, err = run_cli("reproduce", "fig1", "--replot", "--out", str(tmp_path / "o"), "--quiet")
    check_outcome(code, err)
    assert code == 2 and "is not a regular file (a FIFO)" in err, err


def test_heartbeat_lines_for_a_long_call_without_progress():
    import time

    from rich.console import Console

    from headrank.util.progress import Heartbeat

    con = Console(file=io.StringIO(), width=200)
    began = time.monotonic()
    with Heartbeat(con, "reproducing fig3", every_s=0.2):
        while len(con.file.getvalue().splitlines()) < 2 and time.monotonic() - began < 120:  # waits on the beats
            time.sleep(0.01)
    took = time.monotonic() - began
    lines = con.file.getvalue().splitlines()  # the block's end stopped the thread: no more lines come
    assert 2 <= len(lines) <= took / 0.2 + 1 and all(ln.startswith("reproducing fig3 ... (") for ln in lines), lines
    con = Console(file=io.StringIO(), width=200)
    with Heartbeat(con, "quick", every_s=5):
        pass
    assert con.file.getvalue() == ""
