"""What the command line does with an error it did not foresee, a closed pipe and Ctrl-C.

The ``headrank`` entry point (:func:`headrank.cli.main`) turns

- a user's error (:class:`~headrank.errors.HeadRankError`) into one line and exit status 2;
- anything else (a bug) into one line naming the exception's type and message and how to see
  the traceback (``--debug`` or ``HEADRANK_DEBUG=1``), exit status 1 (:func:`unexpected`);
- Ctrl-C into ``interrupted``, exit status 130 (:data:`INTERRUPTED`), at any point of a
  command's life: while the command-line modules are imported (:func:`startup_interrupts`), and
  while the command runs, when the ``KeyboardInterrupt`` would be swallowed (raised inside a
  ``__del__`` or a callback, which Python only prints) or the clean-up takes long: a watchdog ends
  the process :data:`GRACE_S` seconds after the first Ctrl-C, a second Ctrl-C at once
  (:class:`Interrupts`);
- a reader that closed stdout (``headrank spectra M --format csv | head``) into silence, exit
  status 141 (128 + SIGPIPE, what a shell reports for a program killed by SIGPIPE):
  :func:`stdout_broken`, :func:`silence_stdout`.
"""

from __future__ import annotations

import os
import select
import sys

from headrank.errors import one_line

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover - imported before the start-up Ctrl-C handler: kept light
    from collections.abc import Callable
    from typing import Any, NoReturn

DEBUG_ENV = "HEADRANK_DEBUG"
INTERRUPTED = 130
BROKEN_PIPE = 141
GRACE_S = 3.0  # after the first Ctrl-C, the command's own clean-up gets this long
_SIGNALLED = False  # a Ctrl-C came while a command ran (its other error lines are not printed)


def interrupted() -> bool:
    """Whether a Ctrl-C came while the command ran (errors that follow are its consequence)."""
    return _SIGNALLED


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def startup_interrupts() -> Callable[[], None]:
    """While the command-line modules are imported: Ctrl-C is ``error: interrupted`` and exit 130
    at once (no traceback from the middle of an import). Returns the function that puts the
    previous handler back (a no-op outside the main thread or where a handler was set already)."""
    import signal

    if not _main_thread() or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return lambda: None

    def now(signum: int, frame: Any) -> None:
        os.write(2, b"error: interrupted\n")
        os._exit(INTERRUPTED)

    signal.signal(signal.SIGINT, now)
    return lambda: signal.signal(signal.SIGINT, signal.default_int_handler)


class Interrupts:
    """Ctrl-C while a command runs: the first raises ``KeyboardInterrupt`` (the command cleans up
    and :func:`run_app` reports it) and starts a watchdog that reports and ends the process
    (exit 130) :data:`GRACE_S` seconds later if it has not ended by then; a second Ctrl-C ends
    it at once. :meth:`report` prints the one line once, whoever comes first."""

    def __init__(self, print_error: Callable[[str], None], grace_s: float = GRACE_S):
        import threading

        self.print_error, self.grace_s = print_error, grace_s
        self.lock = threading.Lock()
        self.reported = False
        self.first: float | None = None
        self.previous: Any = None

    def __enter__(self) -> Interrupts:
        import signal

        if _main_thread():
            self.previous = signal.signal(signal.SIGINT, self.handler)
        return self

    def __exit__(self, *exc: Any) -> bool:
        import signal

        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
        return False

    def handler(self, signum: int, frame: Any) -> None:
        import threading

        global _SIGNALLED
        if self.first is not None:  # a second Ctrl-C: now
            self.end()
        self.first = 0.0
        _SIGNALLED = True
        threading.Thread(target=self._watch, name="headrank-interrupt", daemon=True).start()
        raise KeyboardInterrupt

    def _watch(self) -> None:
        import time

        time.sleep(self.grace_s)
        self.end()

    def report(self) -> None:
        with self.lock:
            if self.reported:
                return
            self.reported = True
        try:
            self.print_error("interrupted")
        except Exception:  # noqa: BLE001 - a console in a bad state: the plain line
            os.write(2, b"error: interrupted\n")

    def end(self) -> NoReturn:
        self.report()
        for stream in (sys.stderr, sys.stdout):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001, S110 - ending anyway
                pass
        os._exit(INTERRUPTED)


def debug_from_env() -> bool:
    """``HEADRANK_DEBUG`` set to a true value (1, true, yes, on)."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def unexpected(e: BaseException) -> str:
    """The one line for an exception no check turned into a user error."""
    return (f"unexpected {one_line(e, 300, typed=True)} (a bug in headrank; run with "
            f"headrank --debug VERB ... or {DEBUG_ENV}=1 for the traceback)")


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
    interrupts = Interrupts(print_error)
    try:
        with interrupts:
            code = app(args=expand_tilde(sys.argv[1:]), standalone_mode=False)  # Ctrl-C inside a command: 130
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
        if state.get("debug") and interrupts.first is None:
            raise
        if interrupts.first is None:
            print_error(unexpected(e))
            sys.exit(1)
        code = INTERRUPTED  # what failed after a Ctrl-C failed because of it (an import cut short)
    if interrupts.first is not None:
        code = INTERRUPTED
    if code == INTERRUPTED:
        interrupts.report()
        _exit_interrupted(interrupts)
    sys.exit(code if isinstance(code, int) else 0)


def _exit_interrupted(interrupts: Interrupts) -> NoReturn:
    """Exit 130 after a Ctrl-C, for certain: the exit functions run (atexit), then the process
    ends. (``sys.exit(130)`` is not enough: CPython exits by SIGINT instead, status -2, once a
    ``KeyboardInterrupt`` went through any code run by ``PyRun_*``, as some extensions run theirs.)"""
    import atexit
    import signal

    if not _main_thread() or interrupts.first is None:  # no signal came (a KeyboardInterrupt raised by code):
        sys.exit(INTERRUPTED)  # the caller's handler left as it was (an in-process caller goes on)
    signal.signal(signal.SIGINT, lambda *_: interrupts.end())  # a Ctrl-C while exiting: exit 130 still
    atexit._run_exitfuncs()
    interrupts.end()
