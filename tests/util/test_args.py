"""The public functions check their arguments' types (issue 46, "The Python API with wrong types"):
one HeadRankError line naming the parameter, from a fresh interpreter as a user calls them, and
the checker itself against each kind of annotation."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import pytest

from headrank.errors import HeadRankError
from headrank.util.args import checked

CASES = {
    "spectra(bogus=1)": ("headrank.spectra('minilm', bogus=1)", "unknown argument `bogus`"),
    "compress(out=None)": ("headrank.compress('minilm', out=None, keep=0.9)", "`out` must be"),
    "compress(out=7)": ("headrank.compress('minilm', out=7, keep=0.9)", "`out` must be"),
    "track(None)": ("headrank.track(None, 'o')", "`series` must be"),
    "track(revisions=5)": ("headrank.track('x', 'o', revisions=5)", "`revisions` must be"),
    "scale(groups=5)": ("headrank.scale('minilm', groups=5)", "`groups` must be"),
    "load_compressed(None)": ("headrank.load_compressed(None)", "`path` must be"),
    "load_compressed(7)": ("headrank.load_compressed(7)", "`path` must be"),
    "collapse(seqs='x')": ("headrank.collapse('minilm', seqs='x')", "`seqs` must be an integer"),
    "spectra(tol='x')": ("headrank.spectra('minilm', tol='x')", "must be a number"),
}


def test_each_public_verb_refuses_a_wrong_type_in_one_line(tmp_path):
    code = ["import headrank", "from headrank import HeadRankError", "bad = []"]
    for name, (call, match) in CASES.items():
        code += ["try:", f"    {call}", f"    bad.append(({name!r}, 'no error'))",
                 "except HeadRankError as e:",
                 f"    bad += [] if {match!r} in str(e) and chr(10) not in str(e) else [({name!r}, str(e))]",
                 "except Exception as e:", f"    bad.append(({name!r}, repr(e)))"]
    code.append("print(bad)")
    r = subprocess.run([sys.executable, "-c", "\n".join(code)], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "[]"


@checked
def _f(path: str | os.PathLike, *, n: int = 1, x: float = 0.5, flag: bool = False, names: Sequence[str] | None = None,
       layers: Iterable[int] | str | None = None, fn: Callable[[int], None] | None = None,
       groups: dict[str, list[str]] | None = None) -> tuple:
    return (path, n, x, flag, names, layers, fn, groups)


@pytest.mark.parametrize(("kw", "match"), [
    ({"path": None}, "`path` must be a string or a path"), ({"n": True}, "`n` must be an integer"),
    ({"n": 1.5}, "`n` must be an integer"), ({"x": "1"}, "`x` must be a number"), ({"flag": 1}, "`flag` must be"),
    ({"names": "ab"}, "`names` must be"), ({"names": [1, 2]}, "`names` must be"), ({"layers": 5}, "`layers` must"),
    ({"fn": 3}, "`fn` must be"), ({"groups": [1]}, "`groups` must be"), ({"bogus": 1}, "unknown argument `bogus`"),
])
def test_the_checker_refuses(kw, match):
    kw = {"path": "p", **kw}
    with pytest.raises(HeadRankError, match=match):
        _f(kw.pop("path"), **kw)


def test_the_checker_accepts_what_the_annotations_allow():
    import numpy as np

    assert _f(Path("p"), n=np.int64(3), x=2, flag=True, names=("a", "b"), layers=range(3), fn=print,
              groups={"a": ["b"]})[1] == 3
    assert _f("p", layers="0-3", names=None)[5] == "0-3"
    with pytest.raises(HeadRankError, match="missing a required argument"):
        _f()
