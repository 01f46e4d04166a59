"""`empty_kernel_launch_us`: the host cost of launching a trivial kernel, to tell host overhead from device time.

On CUDA an empty Triton kernel is launched when Triton can be used (not in interpreter mode), else a trivial
torch op (`zero_` on a one-element tensor); on CPU the trivial torch op. Launches are issued back to back in
batches and the median per-launch wall time is returned, in microseconds. Results are cached per device.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable

import torch

__all__ = ["empty_kernel_launch_us"]

logger = logging.getLogger(__name__)

_BATCH = 200
_BATCHES = 7


def empty_kernel_launch_us(device: str | torch.device = "cuda") -> float:
    """Median microseconds to launch one empty (or trivial) kernel on `device`."""
    target = torch.device(device)
    if target.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("empty_kernel_launch_us: CUDA is not available; pass device='cpu'")
        if target.index is None:
            target = torch.device("cuda", torch.cuda.current_device())
    return _measure(str(target))


@functools.cache
def _measure(device: str) -> float:
    target = torch.device(device)
    launch = _triton_launcher(target) if target.type == "cuda" else None
    if launch is None:
        scratch = torch.empty(1, device=target)
        launch = scratch.zero_
    sync = (lambda: torch.cuda.synchronize(target)) if target.type == "cuda" else (lambda: None)
    return _per_launch_us(launch, sync)


def _per_launch_us(launch: Callable[[], object], sync: Callable[[], None]) -> float:
    for _ in range(20):
        launch()
    sync()
    samples = []
    for _ in range(_BATCHES):
        start = time.perf_counter()
        for _ in range(_BATCH):
            launch()
        sync()
        samples.append((time.perf_counter() - start) / _BATCH * 1e6)
    samples.sort()
    return samples[len(samples) // 2]


def _triton_launcher(device: torch.device) -> Callable[[], object] | None:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return None
    try:
        import triton

        @triton.jit
        def _empty_kernel(ptr):
            pass

        scratch = torch.empty(1, device=device)
        with torch.cuda.device(device):
            _empty_kernel[(1,)](scratch)
            torch.cuda.synchronize(device)

        def launch() -> None:
            with torch.cuda.device(device):
                _empty_kernel[(1,)](scratch)

        return launch
    except Exception as exc:  # noqa: BLE001 - no usable Triton: measure a torch op instead
        logger.debug("empty Triton kernel unavailable (%s); timing a torch op instead", exc)
        return None
