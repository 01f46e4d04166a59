"""`SandboxResult`: the verdict of one sandboxed candidate run, as the agent sees it."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from forge.outcome import Outcome, ValidationIssue

__all__ = ["STATUSES", "SandboxResult", "SandboxStatus"]

SandboxStatus = Outcome
STATUSES: tuple[str, ...] = tuple(o.value for o in Outcome)


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of `run_candidate`.

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
    `isolation` is an `agent.sandbox.isolation.IsolationLevel` (a str enum: `boundary`, `network`, `none`), with
    `isolation_reason`.
    `source_path` is the candidate file when the run folder was kept, else None.
    """

    status: SandboxStatus
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

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown sandbox status {self.status!r}; expected one of {', '.join(STATUSES)}")
        object.__setattr__(self, "status", Outcome(self.status))

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
