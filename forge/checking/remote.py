"""`RemoteCandidate`: a candidate that runs in another process, judged by `validate` in this one.

Why: a kernel that runs in the process that judges it can patch the judge (`torch.Tensor.any`, `torch.allclose`,
`forge.checking.compare`) or write its own verdict. The sandbox keeps the candidate in its child and runs `validate`
in the harness process with a proxy that satisfies this protocol. Poisoning must happen where the candidate
allocates (its own process and allocator), so `validate` hands the proxy the run plan (the poison pattern and
whether fresh allocations are poisoned by `PoisonFreshAllocations`) instead of applying it here.

The proxy must return outputs whose storage identity mirrors the remote one: an output that aliases an input there
aliases the same input here, and an output that reuses a storage the candidate still holds from an earlier call is
the same storage here, so the oracle's alias and reused-output checks work unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from forge.checking.poison import PoisonPattern
from forge.outcome import CandidateCall
from forge.samples import Sample

__all__ = ["RemoteCandidate", "remote_of"]


@runtime_checkable
class RemoteCandidate(Protocol):
    """Runs the candidate elsewhere. `call` poisons the remote allocator for `output_metas` (the expected outputs'
    shape, dtype, device: `forge.checking.poison.poison_allocator`) and, when `dispatch`, runs the candidate under
    `PoisonFreshAllocations(pattern)`; it returns the outputs and updates `inputs`' tensors in place with what
    the candidate did to its copies; it raises an `Exception` when the candidate raised (or its process is gone)."""

    def call(self, inputs: Sample, pattern: PoisonPattern, dispatch: bool,
             output_metas: Sequence[tuple[tuple[int, ...], torch.dtype, torch.device]]) -> Any: ...


def remote_of(candidate: Any) -> RemoteCandidate | None:
    """The `RemoteCandidate` behind `candidate` (also through a `forge.outcome.CandidateCall`), else None."""
    if isinstance(candidate, CandidateCall):  # its __getattr__ reads through, so unwrap before the check
        candidate = candidate.fn
    return candidate if isinstance(candidate, RemoteCandidate) else None
