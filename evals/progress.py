"""A small progress display for eval runs, written to stderr.

On a terminal it redraws one line: a bar, `done/total`, elapsed time, an ETA from the mean time per item so far,
and the last item's status. When the stream is not a terminal it stays silent, unless `force=True`, in which case
it prints one plain line per finished item (for logs of batch jobs).
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["ProgressBar", "format_duration"]


def format_duration(seconds: float) -> str:
    """`75.2` -> `"1m15s"`, `3725` -> `"1h02m05s"`, `4.2` -> `"4.2s"`."""
    if seconds < 0 or seconds != seconds:
        return "?"
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


class ProgressBar:
    """Progress over `total` items: call `update(status)` once per finished item, `close()` at the end.

    `enabled` is `stream.isatty() or force`. Usable as a context manager.
    """

    def __init__(self, total: int, *, label: str = "", stream: TextIO | None = None, force: bool = False,
                 clock: Callable[[], float] = time.monotonic, width: int | None = None) -> None:
        if total < 0:
            raise ValueError(f"total must be >= 0, got {total}")
        self.total = int(total)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.interactive = bool(getattr(self.stream, "isatty", lambda: False)())
        self.enabled = self.interactive or force
        self.done = 0
        self.last_status = ""
        self._clock = clock
        self._start = clock()
        self._width = width
        self._closed = False

    # -- state --------------------------------------------------------------------------------------------
    @property
    def elapsed_s(self) -> float:
        return self._clock() - self._start

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the mean pace so far (None before the first item)."""
        if self.done == 0:
            return None
        return self.elapsed_s / self.done * max(self.total - self.done, 0)

    def line(self) -> str:
        """The status text without the bar: `label 3/10 elapsed 12.0s eta 28.0s | last status`."""
        eta = self.eta_s
        parts = [self.label] if self.label else []
        parts.append(f"{self.done}/{self.total}")
        parts.append(f"elapsed {format_duration(self.elapsed_s)}")
        parts.append(f"eta {format_duration(eta) if eta is not None else '?'}")
        text = " ".join(parts)
        return f"{text} | {self.last_status}" if self.last_status else text

    # -- output -------------------------------------------------------------------------------------------
    def _render(self) -> str:
        columns = self._width or shutil.get_terminal_size((100, 20)).columns
        bar_width = 20
        filled = int(bar_width * self.done / self.total) if self.total else bar_width
        bar = "[" + "#" * filled + "." * (bar_width - filled) + "] "
        text = bar + self.line()
        return text[: max(columns - 1, 10)]

    def update(self, status: str = "", n: int = 1) -> None:
        """Record `n` more finished items and the latest status, and redraw."""
        self.done = min(self.done + n, self.total) if self.total else self.done + n
        self.last_status = " ".join(str(status).split())
        if not self.enabled:
            return
        if self.interactive:
            self.stream.write("\r\x1b[2K" + self._render())
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    def close(self) -> None:
        """Finish the line on a terminal (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self.enabled and self.interactive:
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
