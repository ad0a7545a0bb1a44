"""What the command line does with an error it did not foresee, a closed pipe and Ctrl-C.

The ``headrank`` entry point (:func:`headrank.cli.main`) turns

- a user's error (:class:`~headrank.errors.HeadRankError`) into one line and exit status 2;
- anything else (a bug) into one line naming the exception's type and message and how to see
  the traceback (``--debug`` or ``HEADRANK_DEBUG=1``), exit status 1 (:func:`unexpected`);
- Ctrl-C into ``interrupted``, exit status 130 (:data:`INTERRUPTED`);
- a reader that closed stdout (``headrank spectra M --format csv | head``) into silence, exit
  status 141 (128 + SIGPIPE, what a shell reports for a program killed by SIGPIPE):
  :func:`stdout_broken`, :func:`silence_stdout`.
"""

from __future__ import annotations

import os
import select
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from headrank.errors import one_line

DEBUG_ENV = "HEADRANK_DEBUG"
INTERRUPTED = 130
BROKEN_PIPE = 141


def debug_from_env() -> bool:
    """``HEADRANK_DEBUG`` set to a true value (1, true, yes, on)."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def unexpected(e: BaseException) -> str:
    """The one line for an exception no check turned into a user error."""
    return (f"unexpected {one_line(e, 300, typed=True)} (a bug in headrank; run with --debug "
            f"or {DEBUG_ENV}=1 for the traceback)")


def stdout_broken() -> bool:
    """True when stdout is a pipe whose reading end is closed (its writes fail with EPIPE)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by a StringIO, closed, ...
        return False
    try:
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(ev & select.POLLERR for _, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # pragma: no cover - no poll() on this platform
        return False


def silence_stdout() -> None:
    """Point stdout's descriptor at /dev/null, so that the final flush at exit cannot fail again
    (Python would print "Exception ignored ... BrokenPipeError")."""
    try:
        fd = sys.stdout.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
    except (AttributeError, OSError, ValueError):
        return
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


def broken_pipe(e: BrokenPipeError, print_error: Callable[[str], None]) -> None:
    """Inside a command: a closed stdout ends it quietly (``typer.Exit(141)``); a pipe or socket
    of our own that broke is one line (the caller then exits 2)."""
    import typer

    if stdout_broken():
        silence_stdout()
        raise typer.Exit(BROKEN_PIPE) from None
    print_error(f"{e.strerror or 'broken pipe'}: {e.filename or 'a pipe or socket closed'}")


def expand_tilde(args: list[str]) -> list[str]:
    """Each word that begins with ``~`` or ``~user``, alone or after an option's ``=``, with the
    home directory in its place, as a shell expands an unquoted word: ``--out "~/x"`` and
    ``--out=~/x`` reach the command as the path the user meant, not a directory named ``~``. A
    word whose user is unknown stays as it is."""
    out = []
    for a in args:
        opt, eq, val = a.partition("=") if a.startswith("--") and "=" in a else ("", "", a)
        out.append(opt + eq + (os.path.expanduser(val) if val.startswith("~") else val))
    return out


def run_app(app: Any, print_error: Callable[[str], None], state: dict[str, bool]) -> NoReturn:
    """Run the typer ``app`` and exit with its status, every failure as one line on stderr.

    Public typer API only: typer 0.29 vendors click, so its usage errors are
    ``typer.TyperException``s (``exit_code`` 2, ``ctx``, ``format_message()``); the "no
    arguments: show the help" error is recognised by its class name, as typer itself does.
    ``state["debug"]`` is set by ``--debug`` (the root callback) or ``HEADRANK_DEBUG``."""
    import typer

    state["debug"] = debug_from_env()
    try:
        code = app(args=expand_tilde(sys.argv[1:]), standalone_mode=False)  # typer turns Ctrl-C inside a command into exit code 130
        sys.stdout.flush()
    except typer.TyperException as e:
        if type(e).__name__ != "NoArgsIsHelpError":  # that one has printed the help already
            ctx = getattr(e, "ctx", None)
            hint = f" (see '{ctx.command_path} --help')" if ctx is not None and e.exit_code == 2 else ""
            print_error(f"{e.format_message()}{hint}")
        sys.exit(e.exit_code)
    except typer.Abort:
        print_error("aborted")
        sys.exit(1)
    except KeyboardInterrupt:
        code = INTERRUPTED
    except BrokenPipeError as e:
        if stdout_broken():
            silence_stdout()
            sys.exit(BROKEN_PIPE)
        if state.get("debug"):
            raise
        print_error(unexpected(e))
        sys.exit(1)
    except Exception as e:
        if state.get("debug"):
            raise
        print_error(unexpected(e))
        sys.exit(1)
    if code == INTERRUPTED:
        print_error("interrupted")
    sys.exit(code if isinstance(code, int) else 0)
