"""pyproject.toml: the license is an SPDX string (the TOML-table form makes setuptools ≥ 77 print a
deprecation banner on every install, twice in `make demo`), and the build backend can read it."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_license_is_an_spdx_string_and_setuptools_reads_it():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert isinstance(meta["project"]["license"], str) and meta["project"]["license"] == "MIT"
    req = [r for r in meta["build-system"]["requires"] if r.startswith("setuptools")]
    assert req == ["setuptools>=77"]  # the first release that reads an SPDX license string
