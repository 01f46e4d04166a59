"""`Verdict`: what the judge (`forge.judging.Judge`) says of one candidate, function kernel or module, wherever it ran.

One record for every caller (the generator's prompts, `make_plan`'s report, eval records, `kforge plan verify`), so
none of them parses a status out of text: `status` is a `forge.outcome.Outcome`; a limit of the harness that was
reached is `limit` (a `HarnessLimit`, with status `harness_error`: never the candidate's fault, never told to the
model as its failure).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from forge.outcome import Outcome, ValidationIssue

__all__ = ["STATUSES", "HarnessLimit", "Verdict"]

STATUSES: tuple[str, ...] = tuple(o.value for o in Outcome)


class HarnessLimit(StrEnum):
    """A limit the harness put on a candidate's process; reaching one is `harness_error`, since the harness sized it
    (from the case: see `forge.sandbox.options.SandboxOptions.sized_for`) and an honest kernel may need more."""

    FILE_SIZE = "file size (RLIMIT_FSIZE)"
    MEMORY = "memory (RLIMIT_DATA)"
    DEVICE_MEMORY = "device memory"
    CPU_TIME = "CPU time (RLIMIT_CPU)"
    OPEN_FILES = "open files (RLIMIT_NOFILE)"
    PROCESSES = "processes (RLIMIT_NPROC)"
    REPLY_SIZE = "reply size (bytes the child may send)"


@dataclass(frozen=True)
class Verdict:
    """The judge's verdict on one candidate.

    `status` (a `forge.outcome.Outcome`, a str enum): `ok` (correct; timed when benchmarking was asked),
    `compile_error` (syntax error, import failure, language compiler error), `runtime_error` (the candidate raised),
    `mismatch` (wrong results: `details["errors"]`, the oracle's structured `details["issues"]` (see `issues`) and the
    worst elements as table rows `details["mismatches"]`), `timeout` (wall-clock limit, or cancelled:
    `details["cancelled"]`), `crash` (killed by a signal: `details["signal"]`, or no valid result), `forbidden`
    (refused by screening: `details["violations"]`; nothing ran), `harness_error` (the harness failed, e.g. the
    reference ran out of memory: `details["harness_error"]`, `details["out_of_memory"]`; not the candidate's fault).
    `message` is one short line. `details` holds structured context: `violations`, `compile_log`, `exception`
    (`type`, `message`, `traceback`), `errors`, `issues`, `mismatches`, `signal`/`signal_number`, `exit_code`,
    `phase`, `cancelled`.
    `latency_ms` / `baseline_ms` are `BenchmarkResult.to_dict()` of the candidate and of the original PyTorch function
    timed in the same child (None when not benchmarked). `stdout`/`stderr` are the child's output (truncated).
    `isolation` is an `forge.sandbox.isolation.IsolationLevel` (a str enum: `boundary`, `network`, `none`), with
    `isolation_reason`.
    `source_path` is the candidate file when the run folder was kept, else None. `limit`: the harness limit that was
    reached (status `harness_error`), else None.
    """

    status: Outcome
    message: str
    details: dict[str, Any] = field(default_factory=dict)
    latency_ms: dict[str, Any] | None = None
    baseline_ms: dict[str, Any] | None = None
    stdout: str = ""
    stderr: str = ""
    isolation: str = "none"
    isolation_reason: str = ""
    wall_s: float = 0.0
    source_path: str | None = None
    limit: HarnessLimit | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown verdict status {self.status!r}; expected one of {', '.join(STATUSES)}")
        object.__setattr__(self, "status", Outcome(self.status))
        if self.limit is not None:
            object.__setattr__(self, "limit", HarnessLimit(self.limit))
            if self.status is not Outcome.HARNESS_ERROR:
                raise ValueError(f"a verdict naming the harness limit {self.limit.value} must be harness_error")

    @property
    def issues(self) -> tuple[ValidationIssue, ...]:
        """The oracle's structured issues (mismatch and runtime_error verdicts from validation), else ()."""
        return tuple(ValidationIssue.from_dict(d) for d in self.details.get("issues") or ())

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def speedup(self) -> float | None:
        """Baseline median over candidate median (> 1 = the candidate is faster); None when not benchmarked."""
        if not self.latency_ms or not self.baseline_ms:
            return None
        candidate, baseline = self.latency_ms.get("median_ms"), self.baseline_ms.get("median_ms")
        if not isinstance(candidate, (int, float)) or not isinstance(baseline, (int, float)):
            return None
        if candidate <= 0:
            return math.inf if baseline > 0 else 1.0
        return baseline / candidate

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (for logs and artifacts)."""
        return asdict(self)
