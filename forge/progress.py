"""Progress messages for long steps (profiling, generation, benchmarking).

They go to the `forge.progress` logger at INFO: silent in a library by default, shown by the `kforge` CLI.
"""

from __future__ import annotations

import logging
import time

__all__ = ["progress", "Stopwatch"]

_logger = logging.getLogger("forge.progress")


def progress(message: str, *args: object) -> None:
    """Report one step of a long-running job."""
    _logger.info(message, *args)


class Stopwatch:
    """Elapsed wall time since construction, for progress lines."""

    def __init__(self) -> None:
        self._start = time.perf_counter()

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self._start

    def __str__(self) -> str:
        return f"{self.elapsed_s:.1f}s"
