"""What every command shares: the typer app and its root options, the consoles, the one-line
error wrapper for commands, the progress display and staged output sets."""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from headrank.errors import ERROR_LINE_LIMIT, HeadRankError, one_line

#: when the command started (near enough: this module is among the first imported), on time.monotonic
STARTED = time.monotonic()

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="How weight decay and architecture shape the rank of attention layers.",
)
# markup off: paths, model types and messages come from the user and may hold square brackets;
# styled parts are rich Text objects, never markup strings.
# piped or redirected, nothing is cut to fit a screen: tables keep full headers and details, lines stay whole
PIPE_WIDTH = 10_000
out_console = Console(width=None if sys.stdout.isatty() else PIPE_WIDTH, markup=False)
err_console = Console(stderr=True, markup=False, width=None if sys.stderr.isatty() else PIPE_WIDTH)  # a piped warning stays one line


def styled(style: str, head: str, rest: str = "") -> Text:
    """``head`` in ``style`` followed by plain ``rest`` (no markup is parsed in either)."""
    return Text.assemble((head, style), rest)


def _print_version(value: bool) -> None:
    if value:
        from headrank.util.env import __version__

        sys.stdout.write(f"headrank {__version__}\n")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", help="print the version and exit", is_eager=True,
                                          callback=_print_version)] = False,
    debug: Annotated[bool, typer.Option("--debug", help="on an unexpected error (a bug), show its traceback "
                                        "instead of one line (also: HEADRANK_DEBUG=1)")] = False,
) -> None:
    """How weight decay and architecture shape the rank of attention layers."""
    _state["debug"] = _state["debug"] or debug


_state = {"debug": False}  # --debug / HEADRANK_DEBUG, read by main()


def print_error(message: str) -> None:
    """``error: MESSAGE`` as one line on stderr (newlines in the message folded into spaces, the
    secrets of any URL in it redacted)."""
    from headrank.cli.errorpath import interrupted
    from headrank.util.redact import redact_text

    if interrupted() and message != "interrupted":  # a consequence of the Ctrl-C: only "interrupted" is said
        return
    err_console.print(styled("bold red", "error: ", redact_text(one_line(message, ERROR_LINE_LIMIT))), highlight=False,
                      soft_wrap=True)


#: Python parameter names whose flag is not ``--`` + the name with dashes
FLAG_ALIASES = {"attn_weight_decay": "--attn-wd", "weight_decay": "--wd", "evaluate": "--eval", "n_seqs": "--seqs",
                "tolerance": "--tol", "sets": "--set", "set": "--set", "groups": "--group", "with_eps": "--with-eps",
                "format": "--format"}  # and every declared flag of headrank.util.constraints


def cli_flags() -> dict[str, str]:
    """Every option of every command: Python parameter name → its long flag (read from the app)."""
    if not _flags:
        import typer.main

        stack = [typer.main.get_command(app)]
        while stack:
            cmd = stack.pop()
            stack += list(getattr(cmd, "commands", {}).values())
            for prm in getattr(cmd, "params", []):
                long = [o for o in getattr(prm, "opts", []) if o.startswith("--")]
                if long and prm.name:
                    _flags.setdefault(prm.name, long[0])
        from headrank.util.constraints import flags

        _flags.update({**FLAG_ALIASES, **flags()})
    return _flags


_flags: dict[str, str] = {}


def option(table: Any, name: str, help: str, *aliases: str, shown: bool = True) -> Any:
    """The typer option of parameter ``name`` of a verb's constraints ``table``
    (:mod:`headrank.util.constraints`): its flag from the table, and ``help`` followed by the
    bounds the table declares (``shown`` False: the help says them in its own words). The value
    is checked by the table's validator, which the verb's function calls: no ``min=``/``max=``
    here that could disagree."""
    p = table[name]
    return typer.Option(p.long, *aliases, help=f"{help} [{p.bounds(for_help=True)}]" if shown else help)


def flag_message(message: str, flags: dict[str, str] | None = None) -> str:
    """A library error in the command line's words: every parameter the library names in
    backticks (`` `layers` ``) becomes its flag (``--layers``); other backticked text stays."""
    import re

    known = {**cli_flags(), **(flags or {})}
    return re.sub(r"`([a-z][a-z0-9_]*)`", lambda m: known.get(m.group(1), m.group(0)), message)


def user_errors(fn):
    """Turn an HeadRankError into one line on stderr and exit status 2.

    The library names paths in its errors; what it could not foresee from a user's input still
    becomes one line: an OSError (a file system refusing, named with its path), a MemoryError
    (sizes this machine cannot hold) or a RecursionError (an input nested too deeply).
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        global STARTED
        STARTED = time.monotonic()  # the command's start (not the import's: an in-process run comes later)
        try:
            return fn(*args, **kwargs)
        except HeadRankError as e:
            print_error(flag_message(str(e)))
        except BrokenPipeError as e:  # stdout's reader went away (`... | head`): quiet exit 141
            from headrank.cli.errorpath import broken_pipe

            broken_pipe(e, print_error)
        except OSError as e:
            where = f" {e.filename}" if getattr(e, "filename", None) else ""
            print_error(f"{e.strerror or type(e).__name__}:{where}" if where else
                        (e.strerror or one_line(e, 200)))
        except MemoryError:
            print_error("out of memory: the input asks for more than this machine can hold")
        except RecursionError:
            print_error("an input is nested too deeply to read")
        raise typer.Exit(2)

    return wrapper


@contextmanager
def destination(out: Path | None, *sources: Any) -> Iterator[Any]:
    """``--out`` checked once and locked for the whole command (:class:`headrank.io.writer.OutputSet`;
    ``sources``: the inputs, where they are local paths, which ``--out`` may not be nor be inside);
    None without ``--out``."""
    if out is None:
        yield None
        return
    from headrank.io.writer import OutputSet

    paths = [Path(s) for s in sources if isinstance(s, (str, Path)) and os.path.exists(s)]
    with OutputSet(out, sources=paths) as dest:
        yield dest


def _save_set(save, dest: Any) -> list[Path]:
    """``save(directory)`` into the staging directory of ``dest`` (:func:`destination`), moved
    in as one set only when every file is written (a failure leaves the previous set as it
    was); the final paths."""
    if dest is None:
        return []
    with dest.stage() as stage:
        files = save(stage)
    return dest.moved(files, stage)


def progress_bar(quiet: bool) -> Progress:
    """A rich bar on a terminal; plain lines every few seconds where stderr is not one."""
    if not quiet and not err_console.is_terminal:
        from headrank.util.progress import LineProgress

        return LineProgress(err_console, start=STARTED)  # the interval counts from the command's start
    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=quiet or not err_console.is_terminal,
    )
