"""A planted run in `--out` (issue 46): a run.json whose runtime_s is a script, a stored figure
name that leaves the run's directory, and a FIFO in place of run.json; each gives an escaped
page or one line, never a script in report.html, a PNG from outside `--out`, or a hang."""

import json
import os

import pytest
from typer.testing import CliRunner

from headrank.cli import app
from headrank.report import runner as rep
from tests.fuzz.harness import time_limit

from .test_replot import RUNS, probe  # noqa: F401 - the probe study fixture
from .test_reproduce_all import probes  # noqa: F401


@pytest.fixture
def alarm():
    with time_limit(30):
        yield


def test_a_script_in_runtime_s_is_escaped_on_replot(tmp_path, probe, alarm):  # noqa: F811
    rep.run("probe", tmp_path, quick=True)
    meta = json.loads((tmp_path / "run.json").read_text())
    meta["runtime_s"] = "<script>alert(1)</script>"
    (tmp_path / "run.json").write_text(json.dumps(meta))
    r = CliRunner().invoke(app, ["reproduce", "probe", "--replot", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "runtime_s must be" in r.output
    assert "<script>alert(1)" not in (tmp_path / "report.html").read_text()


def test_a_stored_figure_name_outside_out_is_not_embedded(tmp_path, probe, alarm):  # noqa: F811
    out = tmp_path / "out"
    rep.run_all(out, quick=True)
    secret = tmp_path / "secret_fig.png"
    secret.write_bytes(b"SECRET-PNG-BYTES")
    meta = json.loads((out / "probe" / "run.json").read_text())
    meta["figures"] = [{"name": "../../secret_fig", "caption": "x"}]
    (out / "probe" / "run.json").write_text(json.dumps(meta))
    import base64

    leaked = base64.b64encode(b"SECRET-PNG-BYTES").decode()
    for args in (["--quick"], ["--replot"]):  # resumed (the stored run reused) and replotted
        r = CliRunner().invoke(app, ["reproduce", "all", *args, "--out", str(out)])
        assert r.exit_code in (0, 2, 3) and "Traceback" not in r.output, r.output
        assert leaked not in (out / "report.html").read_text()


def test_a_fifo_in_place_of_run_json_does_not_hang(tmp_path, probes, alarm):  # noqa: F811
    rep.run_all(tmp_path, quick=True)
    (tmp_path / "ok" / "run.json").unlink()
    os.mkfifo(tmp_path / "ok" / "run.json")
    r = CliRunner().invoke(app, ["reproduce", "ok", "--replot", "--out", str(tmp_path / "ok")])
    assert r.exit_code == 2 and "not a regular file" in r.output
    rep.run_all(tmp_path, quick=True)  # the planted part is run again, not read
