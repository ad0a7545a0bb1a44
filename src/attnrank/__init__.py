"""attnrank: how weight decay and architecture shape the rank of attention layers."""

__version__ = "0.1.0"

from .errors import AttnRankError  # noqa: E402
from .scan import SpectraResult, analyze, spectra  # noqa: E402

__all__ = ["AttnRankError", "SpectraResult", "analyze", "spectra", "__version__"]
