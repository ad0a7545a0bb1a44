"""The one exception type a user's input can cause, and the one way an error becomes one line."""

from __future__ import annotations

ONE_LINE_LIMIT = 300
#: the longest error line the command line prints (a hostile value inside a message cannot make a
#: line of hundreds of thousands of characters)
ERROR_LINE_LIMIT = 2000
_MARK = "..."


class HeadRankError(Exception):
    """A problem with the user's input (path, file, architecture, option).

    The CLI prints its message as one line and exits with status 2.
    """


def one_line(e: BaseException | str, limit: int | None = ONE_LINE_LIMIT, *, typed: bool = False) -> str:
    """``e``'s message as one line: runs of whitespace (newlines included) folded into one space.

    An exception with an empty message reads as its type's name; a string stays as it is (so an
    empty string stays empty). ``typed``: an exception reads ``Type: message`` (``Type`` alone
    when the message is empty). A line longer than ``limit`` characters is cut to exactly
    ``limit``, its last three being ``...``; ``None``: never cut.
    """
    text = " ".join(str(e).split())
    if isinstance(e, BaseException):
        name = type(e).__name__
        text = (f"{name}: {text}" if text else name) if typed else (text or name)
    if limit is not None and len(text) > limit:
        text = text[: max(limit - len(_MARK), 0)] + _MARK[: limit]
    return text
