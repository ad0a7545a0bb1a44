"""The one writer under the verbs other than compress (issue 46's write-side cases): track's
resumable files never escape --out nor write through a symlink; the Python API's ``save`` is a
staged set like the CLI's."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import headrank
from headrank.cli import app
from headrank.errors import HeadRankError

TINY = dict(n_pairs=3, n_keys=6, n_values=6, d_model=16, n_heads=2, batch_size=8)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("w") / "run"
    headrank.train("recall", d, steps=4, track_every=2, checkpoint_every=2, keep_checkpoints="all", log="none",
                   device="cpu", **TINY)
    return d


def _stopped_series(run, out):
    """A track run that stopped before it finished: started.json and no series.json."""
    headrank.track(run, out, workers=1)
    (out / "series.json").unlink()
    for f in ("table.csv", "summary.csv"):
        (out / f).unlink()


def _one_line(r, *words):
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "Traceback" not in r.output, r.output
    assert all(w in r.output for w in words), r.output


def test_resume_never_writes_outside_out_from_a_label(run, tmp_path):
    out = tmp_path / "deep" / "series"
    _stopped_series(run, out)
    plan = json.loads((out / "started.json").read_text())
    plan["items"][0]["label"] = "../../ESCAPED"
    (out / "started.json").write_text(json.dumps(plan))
    r = CliRunner().invoke(app, ["track", str(run), "--out", str(out), "--resume", "--workers", "1", "-q"])
    _one_line(r, "not a plain file name")
    assert not list(tmp_path.rglob("ESCAPED*"))


def test_a_symlinked_partial_table_is_never_appended_to(run, tmp_path):
    out = tmp_path / "series"
    _stopped_series(run, out)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    for p in (out / "checkpoints").glob("*.json"):
        p.unlink()  # nothing reusable: every checkpoint is measured again and appended
    (out / "table.partial.csv").unlink(missing_ok=True)
    (out / "table.partial.csv").symlink_to(victim)
    r = CliRunner().invoke(app, ["track", str(run), "--out", str(out), "--resume", "--workers", "1", "-q"])
    _one_line(r, "symlink")
    assert victim.read_text() == "precious\n"


def test_a_symlinked_checkpoints_dir_is_refused(run, tmp_path):
    out = tmp_path / "series"
    _stopped_series(run, out)
    elsewhere = tmp_path / "elsewhere"
    (out / "checkpoints").rename(elsewhere)
    (out / "checkpoints").symlink_to(elsewhere)
    before = sorted(p.name for p in elsewhere.iterdir())
    for p in elsewhere.glob("*.json"):
        p.unlink()
    r = CliRunner().invoke(app, ["track", str(run), "--out", str(out), "--resume", "--workers", "1", "-q"])
    _one_line(r, "symlink")
    assert sorted(p.name for p in elsewhere.iterdir()) == [n for n in before if n.endswith(".csv")]


def test_spectra_result_save_is_a_staged_set(run, tmp_path):
    """``SpectraResult.save`` from Python: the same writer as the CLI (a failure half way leaves the
    previous set, no lock file, a record of what it wrote)."""
    from headrank.io.writer import RECORD

    res = headrank.spectra(run)
    out = tmp_path / "s"
    files = res.save(out)
    assert {p.name for p in files} <= {p.name for p in out.iterdir()} and (out / RECORD).is_file()
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def broken(*a, **k):
        raise OSError(28, "No space left on device")

    import headrank.analysis.scan as scan

    real = scan.write_json
    scan.write_json = broken
    try:
        with pytest.raises(HeadRankError, match="no space left"):
            res.save(out)
    finally:
        scan.write_json = real
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_spectra_never_overwrites_a_foreign_directory(tmp_path):
    """The red team's case: `spectra --out DIR` where DIR holds the user's own summary.csv and
    nothing headrank wrote: refused in one line, the user's file as it was; an output of an
    earlier run (its meta.json) is written over as before, and a directory of other files of the
    user's (`--out ..`) is written into beside them."""
    from tests.fuzz.harness import write_tiny

    src = write_tiny(tmp_path / "m")
    out = tmp_path / "mine"
    out.mkdir()
    (out / "summary.csv").write_text("my own summary\n")
    r = CliRunner().invoke(app, ["spectra", str(src), "--out", str(out), "--no-plots", "--quiet"])
    _one_line(r, "already holds summary.csv, which headrank did not write")
    assert (out / "summary.csv").read_text() == "my own summary\n"
    assert sorted(p.name for p in out.iterdir()) == ["summary.csv"]
    (out / "summary.csv").unlink()
    r = CliRunner().invoke(app, ["spectra", str(src), "--out", str(out), "--no-plots", "--quiet"])
    assert r.exit_code == 0, r.output
    (out / ".headrank-output.json").unlink()  # as an output written before the record existed
    r = CliRunner().invoke(app, ["spectra", str(src), "--out", str(out), "--no-plots", "--quiet"])
    assert r.exit_code == 0, r.output
    other = tmp_path / "other"
    other.mkdir()
    (other / "thesis.tex").write_text("mine\n")
    r = CliRunner().invoke(app, ["spectra", str(src), "--out", str(other), "--no-plots", "--quiet"])
    assert r.exit_code == 0, r.output
    assert (other / "thesis.tex").read_text() == "mine\n" and (other / "heads.csv").is_file()
