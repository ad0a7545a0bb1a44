"""The small frictions of issue 49, each as a user meets it: run as subprocesses (a fresh
interpreter, stdout a pipe), the output read as printed."""

import json
import os
import re
import subprocess
import sys

import pytest

import headrank

TINY = dict(n_pairs=3, n_keys=6, n_values=6, d_model=16, n_heads=2, batch_size=8)
ENV = dict(os.environ, HF_HUB_OFFLINE="1")


def cli(*args, cwd=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "headrank", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=ENV, cwd=cwd)


def test_architectures_piped_keeps_every_detail_whole():
    piped = cli("architectures")
    assert piped.returncode == 0, piped.stderr
    as_json = json.loads(cli("architectures", "--json").stdout)
    long = max((r["detail"] for r in as_json["types"] if r.get("detail")), key=len)
    assert len(long) > 60 and long in piped.stdout  # cut to a screen's width before ("…")
    assert "…" not in piped.stdout


def test_spectra_footer_names_a_file_that_exists(tmp_path):
    r = cli("spectra", "minilm")
    assert r.returncode == 0 and "meta.json" not in r.stdout.replace("--out also writes them to meta.json", "")
    assert "docs/outputs.md" in r.stdout
    r = cli("spectra", "minilm", "--out", tmp_path / "o", "--no-plots")
    assert r.returncode == 0 and (tmp_path / "o" / "meta.json").is_file()
    assert str(tmp_path / "o" / "meta.json") in "".join(r.stdout.split())  # the caption wraps


def test_track_title_counts_what_the_table_shows(tmp_path):
    run = tmp_path / "run"
    headrank.train("recall", run, steps=4, track_every=1, checkpoint_every=2, keep_checkpoints="all", log="none",
                   device="cpu", **TINY)
    r = cli("track", run, "--out", tmp_path / "t", "--workers", "1", "--no-plots")
    assert r.returncode == 0, r.stderr
    title = next(line for line in r.stdout.splitlines() if "checkpoint" in line and "already done" in line)
    m = re.search(r"(\d+) checkpoints? \((\d+) already done\)(?: \+ (\d+) steps? from metrics\.jsonl)?", title)
    assert m, title
    rows = [line for line in r.stdout.splitlines() if re.match(r"^│\s*\S+\s*│\s*\d+\s*│", line)]
    assert int(m.group(1)) + int(m.group(3) or 0) == len(rows), (title, rows)
    assert int(m.group(3) or 0) > 0  # the tracker's steps between checkpoints are rows too
    assert "definitions:docs/outputs.md" in "".join(r.stdout.split())


def test_series_title_says_one_step():
    from headrank.analysis.series import SeriesItem, _title

    item = SeriesItem(source="run/checkpoints/step-00000002", step=2, label="step-00000002")
    arch = {"model_type": "headrank", "n_layers": 2, "n_heads": 2, "head_dim": 8}
    assert "+ 1 step from metrics.jsonl" in _title([item], arch, 1)
    assert "+ 2 steps from metrics.jsonl" in _title([item], arch, 2)


def test_ray_auto_without_a_cluster_names_our_flag():
    pytest.importorskip("ray")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    code = ("from headrank.util.ray import ray_session\n"
            "from headrank.cli.common import flag_message\n"
            "try:\n    ray_session('auto').__enter__()\nexcept Exception as e:\n    print(flag_message(str(e)))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    line = r.stdout.strip()
    assert line.startswith("--ray auto: no running Ray cluster") and "--address" not in line, (line, r.stderr)
