"""The harness-owned correctness oracle and benchmark used for every candidate kernel.

- `validate(reference_fn, candidate, samples, ...) -> list[ValidationIssue]`: empty list = correct; typed issues
  that read as their message; raises `forge.outcome.HarnessError` when the harness fails (see `validation.py`).
- `benchmark(fn, samples, ...) -> BenchmarkResult`: per-pass timing with fresh inputs, L2 flush, all-stream sync.
- `benchmark_distribution(counted, max_calls=64) -> list[Sample]`: GCD-reduced, capped benchmark pass.
- `SpotCheck` / `SpotCheckError`: `benchmark(..., spot_check=SpotCheck(reference))` compares a few random timed
  passes with the reference after timing (`spot_check.py`).
- `KernelUtils`: the settings of both, bundled (configure or subclass it).
- `empty_kernel_launch_us(device) -> float`: host cost of one trivial kernel launch.
"""

from forge.checking.benchmarking import BenchmarkResult, benchmark
from forge.checking.distribution import benchmark_distribution
from forge.checking.kernel_utils import KernelUtils
from forge.checking.launch import empty_kernel_launch_us
from forge.checking.spot_check import SpotCheck, SpotCheckError
from forge.checking.tolerance import DEFAULT_TOLERANCES
from forge.checking.validation import validate

__all__ = [
    "DEFAULT_TOLERANCES",
    "BenchmarkResult",
    "KernelUtils",
    "SpotCheck",
    "SpotCheckError",
    "benchmark",
    "benchmark_distribution",
    "empty_kernel_launch_us",
    "validate",
]
