"""What ``headrank spectra --out`` starts before the command line is parsed: the figure process.

Its matplotlib import (0.4–0.6 s of CPU) is then under way while typer, rich and the verbs are
imported and the options parsed (about 0.3 s), not only from the command's first line on: on a
1-layer run it would otherwise still be importing when the tables are ready. Started only when
this process is the ``headrank`` program (its console script or ``python -m headrank``) and the
arguments ask for figures; the command takes it (:func:`headrank.analysis.figproc.take_early`),
and one it does not take (a usage error, ``--help``) is stopped at exit.
"""

from __future__ import annotations

import os
import sys


def _is_program(argv0: str) -> bool:
    return os.path.basename(argv0) == "headrank" or argv0.endswith(os.path.join("headrank", "__main__.py"))


def wants_figures(argv: list[str]) -> bool:
    """Whether ``argv`` (``sys.argv``) runs ``headrank spectra … --out DIR`` with its figures."""
    if len(argv) < 3 or not _is_program(argv[0]) or argv[1] != "spectra":
        return False
    rest = argv[2:]
    if any(a in ("--no-plots", "--help", "-h") for a in rest):
        return False
    return any(a == "--out" or a.startswith("--out=") for a in rest)


def start_figures(argv: list[str] | None = None) -> None:
    """Start the figure process now if ``argv`` asks for figures (see the module's docstring)."""
    if wants_figures(sys.argv if argv is None else argv):
        from headrank.analysis.figproc import start_early

        start_early()
