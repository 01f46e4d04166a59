"""One helper for clipping text to a length (messages, table cells, verdict details), used everywhere a message
is shortened, so every shortened message reads the same way."""

from __future__ import annotations

from typing import Any

__all__ = ["clip"]


def clip(text: Any, limit: int, *, collapse: bool = True, ellipsis: str = "...") -> str:
    """`str(text)` cut to at most `limit` characters, ending in `ellipsis` when cut. `collapse`: runs of whitespace,
    newlines included, become one space (a one-line message); otherwise only the ends are stripped."""
    text = " ".join(str(text).split()) if collapse else str(text).strip()
    if len(text) <= limit:
        return text
    return text[: max(limit - len(ellipsis), 0)] + ellipsis
