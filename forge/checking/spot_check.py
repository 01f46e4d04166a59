"""`SpotCheck`: outputs of a few timed passes of `benchmark`, compared with the reference after the timing loop.

WHY (kernels that behave differently when timed). The oracle judges a kernel on calls it can tell apart from timed ones
by their rhythm: `tests/adversarial/kernels/exploit_timed_pass_detector.py` computes for the first 16 calls and,
afterwards, skips the work whenever the input's address was seen in the last 4 calls (the benchmark's recycled clones).
Its output was never looked at, so it was timed (and could be selected) as doing nothing. With a `SpotCheck`,
`benchmark` keeps the outputs of a few timed passes and, once timing is over, runs the reference on the same inputs and
compares with the oracle's own comparison (`forge.checking.expectation.build_expectation`, the tolerance table and
`error_factor` of `validate`, the comparison of `forge.checking.probes`): a kernel that is wrong on any timed pass risks
being caught, and it cannot know which passes are kept.

- Which passes: the count is drawn per benchmark from `passes` (default 2-3; 1 in device/graph mode and for inputs
  over 64 MB) and the passes are a uniform random subset of all timed passes (reservoir sampling: the loop's length
  is not known in advance), drawn from `os.urandom` unless `seed` is given; of a kept pass, `calls_per_pass`
  (default 2) random calls are compared. Whether a pass is kept is decided before it runs, but nothing the kernel
  can see differs: its outputs and inputs are copied after the pass returned (the input sets are refilled by later
  passes), and the pass's pre-call values are rebuilt afterwards from the benchmark's private input variants (never
  from tensors the kernel was handed). In device mode on CUDA (a CUDA-graph replay, no Python per replay) the
  captured output buffers of one random replay are copied out after it finished.
- Where: only outside timed regions (copies after the timer stopped; the reference after the loop, after the
  integrity check of the clocks and `torch.Tensor`), one kept pass at a time, each released once checked.
- Outcome: `SpotCheckError` (a `RuntimeError`, like `IntegrityError`) naming the timed pass, the call within the
  pass (the sample) and the worst error of the first mismatching call; the optimizer records it as the candidate's
  `mismatch` and the evals as `incorrect`. A reference that rejects a timed pass's inputs, or runs out of memory,
  is the harness's failure (`forge.outcome.HarnessError`), never the candidate's.

Cost: each compared call costs one expectation, what one `validate` case pays for its reference (float64 and
native runs, the allowance) plus one comparison; at most `passes[1] x calls_per_pass` (4) per benchmark. Measured
on the loaded 2-core CPU machine with F.silu and the `KernelUtils` defaults: one fp32 [8, 64] sample, 3 ms on a
0.25 s benchmark; one fp32 [64, 4096] sample, 0.3 s (median of 6; up to 0.65 s under load) on a 0.35 s benchmark,
while `validate` of that sample took 1.2-3.4 s. On CUDA the reference runs on the device (milliseconds). Memory: the
copied outputs and inputs of at most 2 passes (1 above 64 MB of inputs) plus, while one is checked, its rebuilt
inputs and the expectation (see `forge.checking.validation` for that bound).
"""

from __future__ import annotations

import logging
import math
import os
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from forge.checking.expectation import ReferenceFailure, build_expectation, synchronize_devices
from forge.checking.probes import compare_with_expectation
from forge.checking.tolerance import resolve_tolerances
from forge.errors import CandidateError
from forge.outcome import HarnessError, ValidationIssue, is_memory_exhaustion
from forge.samples import Sample

__all__ = ["SpotCheck", "SpotCheckError", "SpotRecorder"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SpotCheck:
    """Settings of the spot check of timed passes (see the module docstring).

    `reference`: the function the kernel replaces (what `validate` judged it against). `passes`: inclusive range
    the number of kept passes is drawn from. `calls_per_pass`: how many calls of a kept pass (chosen at random after
    timing) are compared; a pass of the benchmark distribution holds up to 64 calls. `tolerances` / `error_factor`:
    as `validate`'s. `seed`: None draws the choice from `os.urandom` (give one only to reproduce a run)."""

    reference: Callable[..., Any]
    passes: tuple[int, int] = (2, 3)  # as `KernelUtils.spot_check_passes` (why there)
    calls_per_pass: int = 2
    tolerances: Mapping[torch.dtype, tuple[float, float]] | None = field(default=None, hash=False)
    error_factor: float = 4.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not callable(self.reference):
            raise TypeError(f"SpotCheck.reference must be callable, got {type(self.reference).__name__}")
        low, high = self.passes
        if not (isinstance(low, int) and isinstance(high, int) and 1 <= low <= high):
            raise ValueError(f"SpotCheck.passes must be (low, high) ints with 1 <= low <= high, got {self.passes}")
        if not (isinstance(self.calls_per_pass, int) and self.calls_per_pass >= 1):
            raise ValueError(f"SpotCheck.calls_per_pass must be an int >= 1, got {self.calls_per_pass}")
        if not (math.isfinite(self.error_factor) and self.error_factor >= 0):
            raise ValueError(f"SpotCheck.error_factor must be a finite number >= 0, got {self.error_factor}")


class SpotCheckError(CandidateError, RuntimeError):
    """A timed pass's output does not match the reference: the kernel computes something else when it is timed.

    `pass_number`: the timed pass (1-based, warm-up excluded); `call`: the call within the pass (the benchmark
    sample's position); `issue`: the comparison's `ValidationIssue` (worst error, index, expected and actual)."""

    outcome = "mismatch"

    def __init__(self, pass_number: int, passes: int, call: int, issue: ValidationIssue) -> None:
        self.pass_number = pass_number
        self.passes = passes
        self.call = call
        self.issue = issue
        super().__init__(f"spot check of timed pass {pass_number} of {passes}, call {call} of the pass (benchmark "
                         f"sample {call}): the output differs from the reference on the inputs it was timed on: "
                         f"{issue}")


@dataclass
class _Kept:
    """One kept pass: its number, how to rebuild its inputs, its outputs and its inputs after the calls."""

    number: int
    draw: Any
    outputs: list[Any]
    inputs: list[Sample]


class SpotRecorder:
    """The benchmark's side of a `SpotCheck`: chooses passes (`wants_next` before each timed pass), keeps them
    (`keep`), and checks them after the loop (`verify`)."""

    def __init__(self, check: SpotCheck, *, max_passes: int | None = None) -> None:
        self.check = check
        seed = check.seed if check.seed is not None else int.from_bytes(os.urandom(8), "little")
        self._rng = random.Random(seed)
        low, high = check.passes
        if max_passes is not None:
            low, high = min(low, max_passes), min(high, max_passes)
        self.wanted = self._rng.randint(low, high)
        self.kept: list[_Kept] = []
        self.seen = 0
        self._slot: int | None = None

    def wants_next(self) -> bool:
        """Before timed pass `seen + 1`: whether its outputs are kept (reservoir sampling over all timed passes)."""
        self.seen += 1
        if len(self.kept) < self.wanted:
            self._slot = len(self.kept)
        else:
            j = self._rng.randrange(self.seen)
            self._slot = j if j < self.wanted else None
        return self._slot is not None

    def keep(self, draw: Any, outputs: list[Any], inputs: list[Sample]) -> None:
        """Keep the pass `wants_next` chose (replacing, and so releasing, the one its slot held)."""
        assert self._slot is not None, "keep() without wants_next() returning True"
        entry = _Kept(self.seen, draw, outputs, inputs)
        if self._slot == len(self.kept):
            self.kept.append(entry)
        else:
            self.kept[self._slot] = entry
        self._slot = None

    def verify(self, rebuild: Callable[[Any], list[Sample]]) -> None:
        """Compare every kept pass with the reference on its rebuilt inputs, one pass at a time (released as it
        goes); `SpotCheckError` on the first mismatch, `HarnessError` when the reference fails."""
        kept = sorted(self.kept, key=lambda k: k.number)
        self.kept = []
        table = resolve_tolerances(self.check.tolerances)
        while kept:
            entry = kept.pop(0)
            synchronize_devices(entry.outputs, entry.inputs)
            rebuilt = rebuild(entry.draw)
            calls = sorted(self._rng.sample(range(len(rebuilt)), min(self.check.calls_per_pass, len(rebuilt))))
            for call in calls:
                issues = self._compare_call(rebuilt[call], entry.outputs[call], entry.inputs[call], table)
                if issues:
                    worst = max(issues, key=lambda i: i.max_abs_error if i.max_abs_error is not None else math.inf)
                    raise SpotCheckError(entry.number, self.seen, call, worst)
                entry.outputs[call] = rebuilt[call] = None  # free as we go
            del entry, rebuilt
        logger.debug("spot check: passes agree with the reference")

    def _compare_call(self, sample: Sample, output: Any, post_inputs: Sample,
                      table: Mapping[torch.dtype, tuple[float, float]]) -> list[ValidationIssue]:
        try:
            expectation = build_expectation(self.check.reference, sample, table, float(self.check.error_factor))
        except ReferenceFailure as exc:
            cause = exc.__cause__ if exc.__cause__ is not None else exc
            raise HarnessError(f"spot check: the reference failed on a timed pass's inputs ({exc}); the timed pass "
                               "cannot be judged", out_of_memory=is_memory_exhaustion(cause)) from cause
        return compare_with_expectation(expectation, output, post_inputs)
