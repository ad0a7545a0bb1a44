"""Names written before the package was renamed from ``attnrank`` to ``headrank``, read as today's.

Run directories, ``config.json`` files (``model_type: attnrank``), sweep, series and reproduction
outputs written by ``attnrank`` keep opening: every reader of such a file passes the parsed dict
through :func:`upgrade` first. Nothing is rewritten on disk.
"""

from __future__ import annotations

from typing import Any

OLD_NAME = "attnrank"
#: old value -> today's, for the keys that hold the package's name
RENAMED = {"attnrank": "headrank", "attnrank-run": "headrank-run", "attnrank-series": "headrank-series"}
KEYS = ("model_type", "kind")


def upgrade(obj: Any) -> Any:
    """``obj`` with the package's old name in ``model_type``/``kind`` read as the new one, in the
    dict and in the dicts nested in it (a run's ``model``, a series' ``architecture``); a copy
    when anything changed, anything but a dict returned as it is."""
    if not isinstance(obj, dict):
        return obj
    out = {k: upgrade(v) if isinstance(v, dict) else v for k, v in obj.items()}
    out.update({k: RENAMED[v] for k in KEYS if isinstance(v := obj.get(k), str) and v in RENAMED})
    return out if out != obj else obj
