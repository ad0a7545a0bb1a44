"""One declaration per parameter (headrank.util.constraints): for every parameter of every
verb's table, the command line and the Python function refuse the same out-of-bounds value
with the same one line, and the table is the only place its bounds are written."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

import headrank
from headrank.cli import app
from headrank.cli.common import flag_message
from headrank.errors import HeadRankError
from headrank.util.constraints import COMPRESS, SPECTRA, TABLES, TRACK, Param, max_threads

SRC = Path(headrank.__file__).parent
CASES = [(t.verb, p.name) for t in TABLES.values() for p in t]


def _cli_value(v) -> str:
    return repr(v) if isinstance(v, float) else str(v)


def _call(verb: str, name: str, value, tmp: Path, cli: bool):
    """The verb on minilm with ``name`` set to ``value`` (and what else it needs): the command
    line's argument list, or the Python call's error."""
    p = TABLES[verb][name]
    rule = {} if name in ("keep", "rank", "params") else {"rank": 2}  # compress needs exactly one rule
    if cli:
        head = {"spectra": ["spectra", "minilm"], "scale": ["scale", "minilm"], "collapse": ["collapse", "minilm"],
                "train": ["train", "recall", "--out", str(tmp / "r")],
                "sweep": ["sweep", "recall", "--out", str(tmp / "s")], "track": ["track", "minilm", "--out", str(tmp / "t")],
                "compress": ["compress", "minilm", "--out", str(tmp / "c"),
                             *(f"--{k}={v}" for k, v in rule.items())]}[verb]
        return [*head, p.long, _cli_value(value)]
    fn = {"spectra": lambda **kw: headrank.spectra("minilm", **kw), "scale": lambda **kw: headrank.scale("minilm", **kw),
          "collapse": lambda **kw: headrank.collapse("minilm", **kw),
          "train": lambda **kw: headrank.train("recall", tmp / "r", **kw),
          "sweep": lambda **kw: headrank.sweep("recall", tmp / "s", **kw),
          "track": lambda **kw: headrank.track("minilm", tmp / "t", **kw),
          "compress": lambda **kw: headrank.compress("minilm", tmp / "c", **rule, **kw)}[verb]
    with pytest.raises(HeadRankError) as e:
        fn(**{name: value})
    return str(e.value)


@pytest.mark.parametrize(("verb", "name"), CASES, ids=[f"{v}-{n}" for v, n in CASES])
def test_cli_and_api_refuse_the_same_value_with_the_same_line(verb, name, tmp_path):
    p = TABLES[verb][name]
    bad = p.example_bad()
    expected = str(pytest.raises(HeadRankError, p.check, bad).value)  # the table's own line
    if p.cli:
        r = CliRunner().invoke(app, _call(verb, name, bad, tmp_path, cli=True))
        lines = [ln for ln in r.output.splitlines() if ln.strip()]
        assert r.exit_code == 2 and len(lines) == 1, r.output
        assert lines[0] == "error: " + flag_message(expected)
        assert p.long in lines[0]  # the flag the table declares, as typed
    if p.api:
        assert _call(verb, name, bad, tmp_path, cli=False) == expected
    assert not any(tmp_path.iterdir())  # refused before anything was written


@pytest.mark.parametrize("bad", [5, [], [True], ["0"], "0-99"])
def test_layers_are_refused_by_spectra_and_compress_in_the_same_words(bad, tmp_path):
    with pytest.raises(HeadRankError) as s:
        headrank.spectra("minilm", layers=bad)
    with pytest.raises(HeadRankError) as c:
        headrank.compress("minilm", tmp_path / "c", rank=2, layers=bad)
    assert str(s.value) == str(c.value) and "`layers`" in str(s.value) and not any(tmp_path.iterdir())


def test_a_value_inside_the_bounds_passes_on_both_edges():
    t = Param("n", "int", low=1, high=4)
    assert [t.check(v) for v in (1, 4, None)] == [1, 4, None]
    for bad, line in ((0, "`n` must lie in 1..4; got 0"), (5, "`n` must lie in 1..4; got 5"),
                      (2.0, "`n` must be an integer (1..4); got float 2.0"), (True, "`n` must be an integer")):
        with pytest.raises(HeadRankError, match=re.escape(line)):
            t.check(bad)
    f = COMPRESS["keep"]  # (0, 1]
    assert f.check(1) == 1.0 and f.check(1e-9) == 1e-9
    for bad in (0, -0.0, 1.0000001, float("nan"), float("inf")):
        with pytest.raises(HeadRankError, match=re.escape("`keep` must lie in (0, 1]")):
            f.check(bad)
    with pytest.raises(HeadRankError, match=re.escape("`tol` must lie in (0, 1); got 1.0")):
        SPECTRA["tol"].check(1)
    for p, huge in ((SPECTRA["tol"], 10**400), (SPECTRA["threads"], 10**400), (COMPRESS["seq_len"], -10**400)):
        with pytest.raises(HeadRankError, match=f"`{p.name}` must"):  # one line, not an OverflowError
            p.check(huge)
    assert SPECTRA["threads"].upper() == max_threads() and TRACK["workers"].check(max_threads()) == max_threads()


def _typer_calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                isinstance(node.func.value, ast.Name) and node.func.value.id == "typer" and \
                node.func.attr in ("Option", "Argument"):
            yield node


def test_no_bound_is_written_in_a_typer_annotation():
    """Bounds live in the table: no min=/max=/clamp= in any typer.Option or typer.Argument of the CLI."""
    found = []
    for f in sorted((SRC / "cli").glob("*.py")):
        for call in _typer_calls(ast.parse(f.read_text())):
            found += [f"{f.name}:{call.lineno} {k.arg}=" for k in call.keywords if k.arg in ("min", "max", "clamp")]
    assert not found, found
    assert sum(1 for f in (SRC / "cli").glob("*.py") for _ in _typer_calls(ast.parse(f.read_text()))) > 50  # the walk sees them


def test_the_bounds_messages_are_written_only_in_the_table():
    """No other module words a bound of a declared parameter (``\\`tol\\` must lie in ...``)."""
    names = "|".join(sorted({p.name for t in TABLES.values() for p in t}))
    pat = re.compile(rf"`({names})` must (lie in|be (an integer|a number|one of|>))")
    mine = {Path("util/constraints.py")}
    hits = [f"{f.relative_to(SRC)}:{i}" for f in SRC.rglob("*.py") if f.relative_to(SRC) not in mine
            for i, line in enumerate(f.read_text().splitlines(), 1) if pat.search(line)]
    assert not hits, hits


def test_help_shows_the_declared_bounds():
    """What ``--help`` says of each bounded option comes from the table: its flag and its bounds."""
    import typer.main

    commands = typer.main.get_command(app).commands
    for t in TABLES.values():
        cmds = [commands[t.verb]] if t.verb != "train" else list(commands["train"].commands.values())
        for cmd in cmds:
            _declared_in_help(t, {o: prm.help or "" for prm in cmd.params for o in prm.opts}, cmd.name)
    assert "[1..4 per CPU]" in {o: prm.help for prm in commands["compress"].params for o in prm.opts}["--threads"]


def _declared_in_help(t, helps: dict[str, str], where: str) -> None:
    for p in (p for p in t if p.cli and (p.name != "log_every" or where != "vit")):  # vit has no --log-every
        assert p.long in helps, (where, p.long)
        if p.kind in ("int", "float"):
            assert helps[p.long].endswith(f"[{p.bounds(for_help=True)}]"), (where, p.long, helps[p.long])


def test_layers_that_cannot_be_listed_are_one_line_not_a_traceback_or_a_hang():
    """A 0-d array (Iterable, yet iter() raises TypeError: was a traceback) and an endless
    iterator (list() never returned) are refused in one line, before the source is opened."""
    import itertools

    import numpy as np

    from headrank.util.constraints import layers_arg

    with pytest.raises(HeadRankError, match="`layers` must be a spec"):
        layers_arg(np.array(0))
    with pytest.raises(HeadRankError, match="`layers` lists more than"):
        layers_arg(itertools.count())
    assert layers_arg(np.array([0, 2])) == [0, 2] and layers_arg(i for i in (1, 3)) == [1, 3]
