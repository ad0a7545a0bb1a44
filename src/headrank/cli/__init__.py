"""The ``headrank`` command: a thin typer app over the library (options parsed, results printed).

One module per verb group: :mod:`~headrank.cli.spectra` (spectra, compress),
:mod:`~headrank.cli.reproduce`, :mod:`~headrank.cli.train` (train recall|lm|vit),
:mod:`~headrank.cli.experiments` (collapse, scale, track, sweep); :mod:`~headrank.cli.common`
holds the app, the consoles and the one-line error wrapper.
"""

# ruff: noqa: E402, I001  (the start-up Ctrl-C handler comes first; the verb groups keep their order)
from __future__ import annotations

from headrank.cli.errorpath import startup_interrupts

_restore = startup_interrupts()  # a Ctrl-C while typer, rich and the verbs are imported: one line, exit 130

from headrank.cli.early import start_figures

start_figures()  # spectra --out: the figure process imports matplotlib while the rest is imported and parsed

from headrank.cli.common import _state, app, print_error

# importing a verb group registers its commands; --help lists them in this order
from headrank.cli import spectra  # noqa: F401
from headrank.cli import compress  # noqa: F401
from headrank.cli import reproduce  # noqa: F401
from headrank.cli import train  # noqa: F401
from headrank.cli import experiments  # noqa: F401
from headrank.cli import architectures  # noqa: F401

_restore()
__all__ = ["app", "main"]


def main() -> None:
    """The ``headrank`` entry point, the one error path (:func:`headrank.cli.errorpath.run_app`):
    a user or usage error is one line and exit status 2; anything unforeseen is one line naming
    its type and ``--debug`` (exit 1); Ctrl-C is "interrupted" (130); a closed stdout is quiet."""
    from headrank.cli.errorpath import run_app

    run_app(app, print_error, _state)


if __name__ == "__main__":
    main()
