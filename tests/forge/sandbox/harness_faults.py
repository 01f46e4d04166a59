"""Oracle settings whose reference fails the way the harness can (pickled into sandbox children, so they live in an
importable module): the reference raises, raises an out-of-memory error, or really exhausts the child's memory cap."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from forge.checking import KernelUtils


@dataclasses.dataclass(frozen=True)
class FailingReferenceUtils(KernelUtils):
    """`validate` runs the real oracle with a reference that fails: `failure` is "raise" (a broken reference),
    "oom" (torch.OutOfMemoryError, as CUDA raises it), "memory_error" (MemoryError) or "allocate" (asks for 4 TiB:
    a real allocation failure under the sandbox's RLIMIT_DATA cap)."""

    failure: str = "raise"

    def validate(self, reference_fn: Any, candidate: Any, samples: Any) -> Any:
        failure = self.failure

        def reference(*args: Any, **kwargs: Any) -> Any:
            if failure == "raise":
                raise ValueError("the reference is broken")
            if failure == "oom":
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 14.00 GiB")
            if failure == "memory_error":
                raise MemoryError
            if failure == "allocate":
                torch.empty(1 << 40, dtype=torch.float32)  # 4 TiB
            return reference_fn(*args, **kwargs)

        return super().validate(reference, candidate, samples)


@dataclasses.dataclass(frozen=True)
class BrokenHarnessUtils(KernelUtils):
    """`validate` itself fails outside any candidate code (a bug of ours)."""

    def validate(self, reference_fn: Any, candidate: Any, samples: Any) -> Any:
        raise RuntimeError("a bug in the harness")
