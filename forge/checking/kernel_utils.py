"""`KernelUtils`: the oracle's settings in one frozen object, with `validate` and `benchmark` bound to them.

Callers configure it (`KernelUtils(fresh_inputs_per_sample=4)`, `dataclasses.replace(...)`) or subclass it to
change the checks; the optimizer and the LLM sandbox both go through it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from forge.checking.benchmarking import BenchmarkResult, benchmark
from forge.checking.distribution import benchmark_distribution
from forge.checking.validation import validate
from forge.execution import TimingMode, parse_timing_mode
from forge.samples import Sample

__all__ = ["KernelUtils"]


@dataclass(frozen=True)
class KernelUtils:
    """Settings for `validate` and `benchmark` (see those functions for what each one means).

    `timing` is the clock every benchmark through this object uses (`eager`: host-inclusive, `device`: kernel time
    from a CUDA-graph replay); `KernelOptimizer.make_plan(execution=...)` sets it from the execution mode."""

    fresh_inputs_per_sample: int = 2
    seed: int = 0
    error_factor: float = 4.0
    tolerances: Mapping[torch.dtype, tuple[float, float]] | None = None
    require_deterministic: bool = True
    warmup: int = 5
    rounds: int = 30
    min_run_time_s: float = 0.25
    flush_l2: bool = True
    max_benchmark_calls: int = 64
    timing: TimingMode = TimingMode.EAGER

    def __post_init__(self) -> None:
        object.__setattr__(self, "timing", parse_timing_mode(self.timing))

    def validate(
        self, reference_fn: Callable[..., Any], candidate: Callable[..., Any], samples: Sequence[Sample]
    ) -> list[str]:
        """Errors of `candidate` against `reference_fn` on `samples` (empty list = correct)."""
        return validate(
            reference_fn,
            candidate,
            samples,
            fresh_inputs_per_sample=self.fresh_inputs_per_sample,
            seed=self.seed,
            tolerances=self.tolerances,
            error_factor=self.error_factor,
            require_deterministic=self.require_deterministic,
        )

    def benchmark(self, fn: Callable[..., Any], samples: Sequence[Sample]) -> BenchmarkResult:
        """Per-pass timing of `fn` over `samples` (one pass calls `fn` on each sample in order)."""
        return benchmark(
            fn,
            samples,
            warmup=self.warmup,
            rounds=self.rounds,
            min_run_time_s=self.min_run_time_s,
            flush_l2=self.flush_l2,
            mode=self.timing,
        )

    def benchmark_distribution(self, counted: Sequence[tuple[int, Sample]]) -> list[Sample]:
        """One benchmark pass from `(count, sample)` pairs, capped at `max_benchmark_calls`."""
        return benchmark_distribution(counted, self.max_benchmark_calls)
