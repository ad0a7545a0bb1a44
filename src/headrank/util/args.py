"""One check of a public function's arguments against its signature (docs/python.md).

:func:`checked` wraps a verb (``spectra``, ``compress``, ``track``, ``scale``, ``collapse``,
``load_compressed``, ...) so that a call with an unknown keyword (``spectra(x, bogus=1)``), a
missing argument, or an argument whose type its annotation rules out (``compress(src, out=None)``,
``out=7``, ``track(None)``, ``track(x, revisions=5)``, ``scale(m, groups=5)``) raises
:class:`~headrank.errors.HeadRankError` with one line naming the parameter in backticks (the
command line turns it into the flag), instead of a ``TypeError`` or an ``AttributeError`` from
deep inside. Only what an annotation states is checked, at its top level (and the items of a
short sequence): ``str``, ``int`` (not a bool), ``float`` (any real number, not a bool),
``bool``, ``os.PathLike`` / ``Path`` (a string or a path), sequences, dicts, callables, ``None``
and classes; an annotation it cannot read (a name only imported for type checking) is left
unchecked rather than guessed.
"""

from __future__ import annotations

import collections.abc as cabc
import functools
import inspect
import os
import types
import typing
from numbers import Integral, Real
from typing import Any

from headrank.errors import HeadRankError

_ITEMS_CHECKED = 64  # the items of a longer sequence are left to the function
_NOT_CHECKED = object()


def checked(fn=None, *, types: bool | tuple[str, ...] = True):
    """``fn`` with its arguments checked on each call (module docstring). ``types=False``: only
    their names and number (a function that checks each value itself, with its own words); a
    tuple of names: the types of those parameters only (the others it checks itself)."""
    if fn is None:
        return functools.partial(checked, types=types)
    sig = inspect.signature(fn)
    hints: dict[str, Any] | None = None

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        nonlocal hints
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise HeadRankError(f"{fn.__name__}(): {_bind_message(e, sig)}") from None
        if not types:
            return fn(*args, **kwargs)
        if hints is None:
            hints = _hints(fn, sig)
        for name, value in bound.arguments.items():
            want = hints.get(name, _NOT_CHECKED)
            kind = sig.parameters[name].kind
            if want is _NOT_CHECKED or kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD) \
                    or (types is not True and name not in types):
                continue
            if not _fits(value, want):
                raise HeadRankError(f"{fn.__name__}(): `{name}` must be {_describe(want)}; got "
                                    f"{_shown(value)}")
        return fn(*args, **kwargs)

    wrapper.__signature__ = sig  # type: ignore[attr-defined]
    return wrapper


def _bind_message(e: TypeError, sig: inspect.Signature) -> str:
    msg = str(e)
    if "unexpected keyword argument" in msg:
        bad = msg.rsplit("'", 2)[-2] if msg.count("'") >= 2 else "?"
        names = [p for p in sig.parameters if sig.parameters[p].kind is not inspect.Parameter.VAR_KEYWORD]
        return f"unknown argument `{bad}` (it takes {', '.join(names)})"
    return msg


def _hints(fn, sig: inspect.Signature) -> dict[str, Any]:
    """Each parameter's annotation resolved, where it can be (one unresolvable name leaves only
    its own parameter unchecked)."""
    try:
        return typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - a name imported only for type checking
        pass
    out: dict[str, Any] = {}
    glb = getattr(fn, "__globals__", {})
    for name, p in sig.parameters.items():
        ann = p.annotation
        if ann is inspect.Parameter.empty:
            continue
        if isinstance(ann, str):
            try:
                ann = eval(ann, dict(glb), {})  # noqa: S307 - the function's own annotation text
            except Exception:  # noqa: BLE001
                continue
        out[name] = ann
    return out


def _fits(value: Any, want: Any) -> bool:  # noqa: PLR0911 - one case per kind of annotation
    if want is Any or want is _NOT_CHECKED or isinstance(want, typing.TypeVar):
        return True
    if want is None or want is type(None):
        return value is None
    origin = typing.get_origin(want)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, w) for w in typing.get_args(want))
    if origin is typing.Literal:
        return value in typing.get_args(want)
    if want is bool:
        return isinstance(value, bool)
    if want is int:
        return isinstance(value, Integral) and not isinstance(value, bool)
    if want is float:
        return isinstance(value, Real) and not isinstance(value, bool)
    if want is str:
        return isinstance(value, str)
    if want in (os.PathLike, os.PathLike[str]) or (isinstance(want, type) and issubclass(want, os.PathLike)):
        return isinstance(value, (str, os.PathLike))
    if origin is not None:
        return _fits_generic(value, origin, typing.get_args(want))
    if want in (cabc.Callable, typing.Callable):
        return callable(value)
    if isinstance(want, type):
        return isinstance(value, want)
    return True


def _fits_generic(value: Any, origin: Any, args: tuple[Any, ...]) -> bool:
    if origin in (cabc.Callable,):
        return callable(value)
    if origin in (list, tuple, set, frozenset, cabc.Sequence, cabc.Iterable, cabc.Collection):
        if isinstance(value, (str, bytes)) or not isinstance(value, cabc.Iterable):
            return False
        if origin in (list, tuple, cabc.Sequence) and not isinstance(value, (list, tuple)):
            return origin is not list and isinstance(value, cabc.Sequence)
        item = args[0] if args and not (origin is tuple and (len(args) != 2 or args[1] is not Ellipsis)) else Any
        if isinstance(value, (list, tuple)) and len(value) <= _ITEMS_CHECKED:
            return all(_fits(v, item) for v in value)
        return True
    if origin in (dict, cabc.Mapping):
        return isinstance(value, cabc.Mapping)
    return isinstance(value, origin) if isinstance(origin, type) else True


def _describe(want: Any) -> str:
    if want is None or want is type(None):
        return "None"
    origin = typing.get_origin(want)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(dict.fromkeys(_describe(w) for w in typing.get_args(want)))
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(want))
    if want is float:
        return "a number"
    if want is int:
        return "an integer"
    if want is bool:
        return "True or False"
    if want is str:
        return "a string"
    if want is os.PathLike or (isinstance(want, type) and issubclass(want, os.PathLike)):
        return "a path"
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        name = {"Callable": "a function", "dict": "a dict", "Mapping": "a dict"}.get(name, name.lower())
        return name if name.startswith("a ") else f"{'an' if name[0] in 'aeiou' else 'a'} {name}"
    return getattr(want, "__name__", str(want))


def _shown(value: Any) -> str:
    s = repr(value)
    return f"{type(value).__name__} {s if len(s) <= 40 else s[:37] + '...'}"
