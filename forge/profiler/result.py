"""What a profiling run found: `FunctionProfile` per intercepted function and the `ProfileResult` that holds them.

Times are per profiling pass (averaged over the passes) and in milliseconds; `time_spent_pct` is a share of the
whole module's forward time (kernel time on CUDA, CPU time on the CPU), so the shares add up to at most 100.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from forge.samples import Sample

__all__ = ["SUMMARY_COLUMNS", "FunctionProfile", "ProfileResult"]

SUMMARY_COLUMNS = ("function_name", "calls", "unique_samples", "total_time_ms", "time_spent_pct", "mean_time_us")


@dataclass(frozen=True)
class FunctionProfile:
    """Calls, samples and time of one `torch.nn.functional` function inside the profiled module.

    - `calls`: calls per profiling pass (the sum of the per-signature counts).
    - `unique_samples`: distinct call signatures (shape, dtype, device, strides and non-tensor values).
    - `samples`: `(calls per pass, cloned Sample)` per signature in first-seen order; empty when the function was
      not among the profiler's `function_names` (it is still timed and counted).
    - `total_time_ms`: time per pass spent in the function itself (nested functionals have their own rows).
    - `sample_times_ms`: time per pass of each signature, in the same first-seen order as `samples`.
    - `time_spent_pct`: `total_time_ms` as a share of the module's whole forward time.
    """

    name: str
    calls: int
    unique_samples: int
    total_time_ms: float
    time_spent_pct: float
    sample_times_ms: tuple[float, ...] = ()
    samples: list[tuple[int, Sample]] = field(default_factory=list)

    @property
    def collected(self) -> bool:
        """Whether input samples were kept for this function."""
        return bool(self.samples)

    @property
    def mean_time_us(self) -> float:
        """Mean time per call in microseconds (NaN for a function with no calls)."""
        return self.total_time_ms * 1000.0 / self.calls if self.calls else float("nan")


@dataclass(frozen=True)
class ProfileResult:
    """Profiles of every intercepted function called inside the module, in descending time order.

    `total_time_ms` is the module's forward time per pass (kernel time on CUDA, CPU time on the CPU);
    `device` is `"cuda"` or `"cpu"`: which clock the times come from.
    """

    functions: dict[str, FunctionProfile]
    total_time_ms: float
    device: str
    profile_iterations: int = 1

    def summary(self, top_k: int | None = None) -> pd.DataFrame:
        """One row per function, slowest first, with columns `SUMMARY_COLUMNS`; the `top_k` slowest if given."""
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
            raise ValueError(f"top_k must be None or a non-negative int, got {top_k!r}")
        rows = [
            (p.name, p.calls, p.unique_samples, p.total_time_ms, p.time_spent_pct, p.mean_time_us)
            for p in self.functions.values()
        ]
        frame = pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))
        frame = frame.sort_values("total_time_ms", ascending=False, kind="stable").reset_index(drop=True)
        if top_k is not None:
            frame = frame.head(top_k).reset_index(drop=True)
        return frame
