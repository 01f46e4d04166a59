"""`KernelUtils`: the oracle's settings in one frozen object, with `validate` and `benchmark` bound to them.

Callers configure it (`KernelUtils(fresh_inputs_per_sample=4)`, `dataclasses.replace(...)`) or subclass it to
change the checks; the optimizer and the LLM sandbox both go through it.

`KernelUtils.validate` is `forge.checking.validate` plus the defences against kernels that game the oracle (on the H200,
exploits that patched the judge or told judged calls from timed ones were selected at up to 1,600x) that need no change
to it:
1. integrity: a judge patched before this candidate ran (by code imported earlier) is restored, not charged; a change
   made while this candidate is validated or probed (`torch.Tensor` methods, timers, `torch.nn.functional`, the
   oracle's references, the harness's own functions, mode stacks: `forge.checking.integrity`) is an issue of the
   `integrity` probe and the originals are put back;
2. once `validate` passes, `forge.checking.probes` (randomised extra calls, wide inputs, in-place updates, input
   dependence, offset views, quiescence), each issue naming its probe in `ValidationIssue.run`.
`KernelUtils.benchmark(fn, samples, reference=...)` also spot-checks timed passes (`forge.checking.spot_check`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from forge.checking import integrity
from forge.checking.benchmarking import BenchmarkResult, benchmark
from forge.checking.distribution import benchmark_distribution
from forge.checking.integrity import Snapshot
from forge.checking.probes import Probe, ProbeSettings, run_probes
from forge.checking.spot_check import SpotCheck
from forge.checking.tolerance import resolve_tolerances
from forge.checking.validation import validate
from forge.execution import TimingMode, parse_timing_mode
from forge.outcome import CandidateCall, Outcome, ValidationIssue
from forge.samples import Sample

__all__ = ["KernelUtils"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class KernelUtils:
    """Settings for `validate` and `benchmark` (see those functions for what each one means).

    `timing` is the clock every benchmark through this object uses (`eager`: host-inclusive, `device`: kernel time
    from a CUDA-graph replay); `KernelOptimizer.make_plan(execution=...)` sets it from the execution mode.
    `spot_check_passes`: how many timed passes `benchmark(..., reference=...)` compares (`SpotCheck.passes`).
    `check_layout`: outputs must have PyTorch's strides (a kernel replacing a call inside a model); module problems
    judged as a whole (`forge.judging.check_module`) compare values only."""

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
    probes: ProbeSettings = field(default_factory=ProbeSettings)
    # At least two: the timed-pass detector of the adversarial corpus (wrong only on passes whose input address
    # recurs, most of them) outlived one or two checked passes in 13 of 300 quick benchmarks, two or three in 1 of
    # 1500 (CI machine); a checked pass of a small input costs ~3 ms.
    spot_check_passes: tuple[int, int] = (2, 3)
    check_layout: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "timing", parse_timing_mode(self.timing))

    def validate(
        self, reference_fn: Callable[..., Any], candidate: Callable[..., Any], samples: Sequence[Sample]
    ) -> list[str]:
        """Errors of `candidate` against `reference_fn` on `samples` (empty list = correct): `validate`, then the
        probes, with the judge's integrity checked around both (see the module docstring)."""
        stale = integrity.baseline().changes()
        if stale:  # changed before this candidate ran: put back, not charged to it
            logger.warning("restoring what was patched before this validation: %s",
                           ", ".join(c.describe() for c in stale))
            integrity.baseline().restore()
        before = Snapshot.take()
        try:
            errors = list(validate(
                reference_fn,
                candidate,
                samples,
                fresh_inputs_per_sample=self.fresh_inputs_per_sample,
                seed=self.seed,
                tolerances=self.tolerances,
                error_factor=self.error_factor,
                require_deterministic=self.require_deterministic,
                check_layout=self.check_layout,
            ))
            tampered = _integrity_issues(before, "during validation")
            if errors or tampered:
                return tampered + errors
            errors = run_probes(reference_fn, CandidateCall(candidate), samples,
                                table=resolve_tolerances(self.tolerances), error_factor=self.error_factor,
                                settings=self.probes, seed=self.seed)
            return _integrity_issues(before, "during the probes") + errors
        except BaseException:  # a harness failure still leaves the judge as it was
            before.restore()
            raise

    def benchmark(
        self, fn: Callable[..., Any], samples: Sequence[Sample], *, reference: Callable[..., Any] | None = None
    ) -> BenchmarkResult:
        """Per-pass timing of `fn` over `samples` (one pass calls `fn` on each sample in order). With `reference`,
        a few random timed passes are compared with it afterwards, with this object's tolerances
        (`forge.checking.spot_check`): `SpotCheckError` when `fn` computed something else while timed."""
        spot_check = None
        if reference is not None:
            spot_check = SpotCheck(reference, passes=self.spot_check_passes, tolerances=self.tolerances,
                                   error_factor=self.error_factor)
        return benchmark(
            fn,
            samples,
            warmup=self.warmup,
            rounds=self.rounds,
            min_run_time_s=self.min_run_time_s,
            flush_l2=self.flush_l2,
            mode=self.timing,
            spot_check=spot_check,
        )

    def benchmark_distribution(self, counted: Sequence[tuple[int, Sample]]) -> list[Sample]:
        """One benchmark pass from `(count, sample)` pairs, capped at `max_benchmark_calls`."""
        return benchmark_distribution(counted, self.max_benchmark_calls)


def _integrity_issues(before: Snapshot, when: str) -> list[ValidationIssue]:
    """An `integrity` issue naming every change since `before` (the originals are put back)."""
    changes = before.changes()
    if not changes:
        return []
    before.restore()
    error = integrity.IntegrityError(changes, when=when, restored=True)
    return [ValidationIssue(str(error), kind=Outcome.MISMATCH, run=Probe.INTEGRITY.value, case=Probe.INTEGRITY.value)]


integrity.extend_baseline()  # every harness module is loaded by now
