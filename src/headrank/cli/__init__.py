"""The ``headrank`` command: a thin typer app over the library (options parsed, results printed).

One module per verb group: :mod:`~headrank.cli.spectra` (spectra, compress),
:mod:`~headrank.cli.reproduce`, :mod:`~headrank.cli.train` (train recall|lm|vit),
:mod:`~headrank.cli.experiments` (collapse, scale, track, sweep); :mod:`~headrank.cli.common`
holds the app, the consoles and the one-line error wrapper.
"""

from __future__ import annotations  # noqa: I001  (the verb groups below keep their order)

from headrank.cli.common import _state, app, print_error

# importing a verb group registers its commands; --help lists them in this order
from headrank.cli import spectra  # noqa: F401
from headrank.cli import reproduce  # noqa: F401
from headrank.cli import train  # noqa: F401
from headrank.cli import experiments  # noqa: F401
from headrank.cli import architectures  # noqa: F401

__all__ = ["app", "main"]


def main() -> None:
    """The ``headrank`` entry point, the one error path (:func:`headrank.util.errorpath.run_app`):
    a user or usage error is one line and exit status 2; anything unforeseen is one line naming
    its type and ``--debug`` (exit 1); Ctrl-C is "interrupted" (130); a closed stdout is quiet."""
    from headrank.util.errorpath import run_app

    run_app(app, print_error, _state)


if __name__ == "__main__":
    main()
