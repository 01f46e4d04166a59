"""Poisoned memory, so an output the candidate never wrote cannot pass by holding stale (or expected) values.

Two mechanisms:

- `PoisonFreshAllocations`, a `TorchDispatchMode` that fills the result of every aten empty-like allocation
  (`empty`, `empty_strided`, `empty_like`, `new_empty`, `new_empty_strided`, `empty_permuted`) with a poison
  pattern while the candidate runs. Works on CPU and CUDA. Under a dispatch mode `torch.compile`d code does not
  run compiled (torch 2.13 runs the frame eagerly, and a frame first seen under a mode stays uncompiled), so
  callers must also run the candidate without the mode, and run it without the mode *first*.
- `poison_allocator`, which allocates blocks of the given tensor sizes (plus, on CUDA, one large block), fills
  them with the pattern and frees them, so the caching allocator hands poisoned memory to the next allocations
  of those sizes (this is what overwrites a freed reference output). On CPU this is only a best effort.

Memory: `poison_allocator` holds one block per output leaf (the outputs' size, which the candidate is about to
allocate anyway) plus, on CUDA, one block of at most 1 GB (and at most a quarter of the free memory), and frees
them before the candidate runs; `fill_with_poison` fills in place. Neither allocates more than that, so poisoning
never raises the oracle's peak above the candidate's own run (the oracle's memory bound, `forge.checking.validation`).
Since `validate` now releases each run's output once it is checked, the output-sized blocks are also what overwrite
the previous run's (correct) output before the next run may be handed its memory.

Two patterns exist so that a result that depends on uninitialised memory changes between runs: `POISON_NAN`
(NaN for floats, the dtype's max for ints, True for bools) and `POISON_LARGE` (a quarter of the dtype's largest
finite value, the dtype's min for ints, False for bools).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from forge.checking.dispatch_mode import HarnessDispatchMode
from forge.samples import iter_tensors

__all__ = [
    "POISON_LARGE",
    "POISON_NAN",
    "PoisonFreshAllocations",
    "PoisonPattern",
    "fill_with_poison",
    "poison_allocator",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PoisonPattern:
    """How to fill uninitialised memory: `float_fill` is "nan" or "large", `int_fill` is "max" or "min"."""

    name: str
    float_fill: str
    int_fill: str
    bool_fill: bool

    def value_for(self, dtype: torch.dtype) -> Any:
        if dtype == torch.bool:
            return self.bool_fill
        if dtype.is_floating_point or dtype.is_complex:
            if self.float_fill == "nan":
                return float("nan")
            component = {torch.complex64: torch.float32, torch.complex128: torch.float64}.get(dtype, dtype)
            return float(torch.finfo(component).max) / 4
        info = torch.iinfo(dtype)
        return info.max if self.int_fill == "max" else info.min


POISON_NAN = PoisonPattern("NaN", float_fill="nan", int_fill="max", bool_fill=True)
POISON_LARGE = PoisonPattern("large values", float_fill="large", int_fill="min", bool_fill=False)


def fill_with_poison(tensor: torch.Tensor, pattern: PoisonPattern) -> None:
    """Fill `tensor` in place with the pattern (silently skipped for dtypes or layouts that cannot be filled)."""
    if tensor.numel() == 0 or tensor.layout != torch.strided or tensor.device.type == "meta":
        return
    try:
        value = pattern.value_for(tensor.dtype)
        try:
            tensor.fill_(value)
        except RuntimeError:
            if pattern.float_fill != "nan" or not tensor.dtype.is_floating_point:
                raise
            tensor.fill_(float(torch.finfo(tensor.dtype).max))  # dtypes without NaN
    except (RuntimeError, TypeError, ValueError) as exc:
        logger.debug("cannot poison a %s tensor: %s", tensor.dtype, exc)


def _aten_packets() -> frozenset:
    names = ("empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "empty_permuted")
    return frozenset(p for p in (getattr(torch.ops.aten, n, None) for n in names) if p is not None)


_ALLOCATION_PACKETS = _aten_packets()


class PoisonFreshAllocations(HarnessDispatchMode):
    """Dispatch mode: every tensor from an aten empty-like allocation comes back filled with the pattern."""

    def __init__(self, pattern: PoisonPattern) -> None:
        super().__init__()
        self.pattern = pattern
        self.poisoned = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's protocol
        result = func(*args, **(kwargs or {}))
        if func.overloadpacket in _ALLOCATION_PACKETS:
            for tensor in iter_tensors(result):
                fill_with_poison(tensor, self.pattern)
                self.poisoned += 1
        return result


_LARGE_BLOCK_MIN = 64 << 20
_LARGE_BLOCK_MAX = 1 << 30


def poison_allocator(
    tensors: Iterable[tuple[tuple[int, ...], torch.dtype, torch.device]], pattern: PoisonPattern
) -> None:
    """Allocate, fill and free blocks of the given `(shape, dtype, device)`s (plus a large block on CUDA).

    Call it right before the candidate runs (after its inputs are cloned) so that the freed blocks the caching
    allocator hands out next hold the pattern rather than stale values.
    """
    blocks: list[torch.Tensor] = []
    total: dict[torch.device, int] = {}
    largest: dict[torch.device, torch.dtype] = {}
    try:
        with torch.no_grad():
            for shape, dtype, device in tensors:
                device = torch.device(device)
                if device.type == "meta":
                    continue
                block = torch.empty(shape, dtype=dtype, device=device)
                fill_with_poison(block, pattern)
                blocks.append(block)
                nbytes = block.numel() * block.element_size()
                if nbytes >= total.get(device, 0) or device not in largest:
                    largest[device] = dtype
                total[device] = total.get(device, 0) + nbytes
            for device, nbytes in total.items():
                if device.type != "cuda":
                    continue
                free, _ = torch.cuda.mem_get_info(device)
                size = min(max(_LARGE_BLOCK_MIN, 2 * nbytes), _LARGE_BLOCK_MAX, free // 4)
                dtype = largest[device]
                itemsize = torch.empty((), dtype=dtype).element_size()
                if size >= itemsize:
                    block = torch.empty(size // itemsize, dtype=dtype, device=device)
                    fill_with_poison(block, pattern)
                    blocks.append(block)
    except (RuntimeError, MemoryError) as exc:  # out of memory: poisoning is best effort
        logger.debug("allocator poisoning stopped early: %s", exc)
    finally:
        del blocks
