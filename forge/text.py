"""One helper for clipping text to a length (messages, table cells, verdict details), used everywhere a message
is shortened, so every shortened message reads the same way; and one for parsing Python source (`parse_python`),
used everywhere source is parsed, so threads never parse at once.

Why the lock: CPython 3.11's AST constructor keeps its recursion depth in state shared by threads, and two
`ast.parse` calls at once can fail with `SystemError: AST constructor recursion depth mismatch` (python/cpython
gh-106905). Seen here when the judge screened one file for several sandbox children at once (`Judge.judge_ahead`),
on the CPU machine with Python 3.11: the honest file's screening raised and its judgement was lost.
"""

from __future__ import annotations

import ast
import threading
from typing import Any

__all__ = ["clip", "parse_python"]

_PARSING = threading.Lock()


def parse_python(source: str, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse(source, filename)`, one thread at a time (see the module docstring); SyntaxError as usual."""
    with _PARSING:
        return ast.parse(source, filename=filename)


def clip(text: Any, limit: int, *, collapse: bool = True, ellipsis: str = "...") -> str:
    """`str(text)` cut to at most `limit` characters, ending in `ellipsis` when cut. `collapse`: runs of whitespace,
    newlines included, become one space (a one-line message); otherwise only the ends are stripped."""
    text = " ".join(str(text).split()) if collapse else str(text).strip()
    if len(text) <= limit:
        return text
    return text[: max(limit - len(ellipsis), 0)] + ellipsis
