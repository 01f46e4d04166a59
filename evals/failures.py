"""`Failure`: why an eval record is not correct, the stable `failure` field of every record.

Why typed: reports, the worker pool (a device fault ends the worker's CUDA context) and summaries used to read the
category back out of `failure_reason` text (`"compile error: ..."` split at the first ':'), so a reworded message
changed what was counted. Every record now carries `failure` (a `Failure` value, None when correct) and `outcome`
(the judge's `forge.outcome.Outcome`, None when no candidate was judged); `failure_reason` is text for people,
`"<label>: <detail>"`, written from the same value.

| `failure` | label in `failure_reason` | outcome | meaning |
|---|---|---|---|
| `unsupported` | unsupported | - | the source cannot serve this problem |
| `generation_failed` | generation failed | - | the source produced no candidate (LLM turns exhausted, cancelled) |
| `compile_error` | compile error | compile_error | the candidate could not be built or imported |
| `runtime_error` | runtime error | runtime_error | it raised on the oracle's inputs |
| `mismatch` | incorrect | mismatch | wrong results, structure, aliasing, non-determinism |
| `forbidden` | forbidden | forbidden | refused by screening or by the run-time launch check |
| `timeout` | timeout | timeout | it ran out of time (or generation did) |
| `crash` | crash | crash | its process died (a signal, an exit) |
| `benchmark_error` | benchmark error | runtime_error | correct, but it raised while being timed |
| `device_fault` | cuda_error | runtime_error | a GPU fault that may leave the CUDA context unusable |
| `source_error` | source error | harness_error | a bug of the eval source |
| `harness_error` | harness_error | harness_error | the harness failed (never the candidate's fault) |
"""

from __future__ import annotations

from enum import StrEnum

from forge.outcome import Outcome
from forge.text import clip

__all__ = ["DETAIL_CHARS", "Failure", "failure_text"]

DETAIL_CHARS = 600  # a record's failure detail and each kept error message: one line, at most this long


class Failure(StrEnum):
    """Why a record is not correct (see the module docstring)."""

    UNSUPPORTED = "unsupported"
    GENERATION_FAILED = "generation_failed"
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    MISMATCH = "mismatch"
    FORBIDDEN = "forbidden"
    TIMEOUT = "timeout"
    CRASH = "crash"
    BENCHMARK_ERROR = "benchmark_error"
    DEVICE_FAULT = "device_fault"
    SOURCE_ERROR = "source_error"
    HARNESS_ERROR = "harness_error"

    @property
    def label(self) -> str:
        """The words `failure_reason` starts with."""
        return _LABELS.get(self, self.value.replace("_", " "))

    @property
    def outcome(self) -> Outcome | None:
        """The judge's outcome this failure stands for (None: no candidate was judged)."""
        return _OUTCOMES.get(self)

    @classmethod
    def of(cls, outcome: Outcome) -> Failure:
        """The failure of a judged candidate whose verdict was `outcome` (not `ok`)."""
        if outcome is Outcome.OK:
            raise ValueError("an ok verdict is not a failure")
        return cls(outcome.value)


_LABELS = {Failure.GENERATION_FAILED: "generation failed", Failure.MISMATCH: "incorrect",
           Failure.DEVICE_FAULT: "cuda_error", Failure.HARNESS_ERROR: "harness_error"}
_OUTCOMES = {Failure.COMPILE_ERROR: Outcome.COMPILE_ERROR, Failure.RUNTIME_ERROR: Outcome.RUNTIME_ERROR,
             Failure.MISMATCH: Outcome.MISMATCH, Failure.FORBIDDEN: Outcome.FORBIDDEN,
             Failure.TIMEOUT: Outcome.TIMEOUT, Failure.CRASH: Outcome.CRASH,
             Failure.BENCHMARK_ERROR: Outcome.RUNTIME_ERROR, Failure.DEVICE_FAULT: Outcome.RUNTIME_ERROR,
             Failure.SOURCE_ERROR: Outcome.HARNESS_ERROR, Failure.HARNESS_ERROR: Outcome.HARNESS_ERROR}


def failure_text(failure: Failure | str, detail: str) -> str:
    """`"<label>: <detail>"` with the detail on one line and clipped (`failure` a `Failure`, or a free label for
    notes that are not failures, e.g. "eager not timed")."""
    label = failure.label if isinstance(failure, Failure) else str(failure)
    detail = clip(detail, DETAIL_CHARS)
    return f"{label}: {detail}" if detail else f"{label}: (no detail)"
