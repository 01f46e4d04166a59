"""The contract every kernel source meets in an eval: `EvalSource`, and the `Candidate` it hands to the checker.

A source turns a problem into a candidate: for a function problem a callable that replaces
`torch.nn.functional.<function>` (a prepared `forge.KernelProvider`), for a module problem a `build(seed)` that
returns the candidate model (KernelBench's `ModelNew`) on the device. `EvalSource.evaluate` then runs the same
oracle for every source (`evals.sources.evaluation`): correctness with `forge.checking`, then the candidate, eager
PyTorch and `torch.compile` timed side by side, and returns one record (`evals.metrics.RECORD_COLUMNS`).

Sources are pickled into worker processes, so keep per-process state (compiled functions, LLM clients) out of
`__init__`: build it in `setup`, which each worker calls once before its first `evaluate`.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from evals.failures import Failure, failure_text
from evals.problems import FunctionProblem, ModuleProblem, Problem
from forge.samples import Sample

if TYPE_CHECKING:
    from forge.checking import KernelUtils
    from forge.judging import CandidateCode

__all__ = ["Candidate", "EvalSource", "USAGE_KEYS"]

# Usage fields a source may report; they become record columns of the same names.
USAGE_KEYS = ("prompt_tokens", "completion_tokens", "cost_usd", "attempts")


@dataclass(frozen=True)
class Candidate:
    """What a source offers for one problem: exactly one of `fn` (function problems), `build` (module problems:
    `build(seed)` returns the model) or `failure` (a `Failure`, with `error` its `"<label>: <detail>"` text).

    `code` (a `forge.judging.CandidateCode`): the candidate's source when it is code from a model; the judge then
    runs that in its sandbox for the verdict (`fn` / `build` only serve the timing, in this process, once the
    verdict is `ok`). Without it the candidate is code this process trusts and is judged in process. `name` says
    what the candidate is (e.g. `"torch.compile(relu)"`). `usage` holds what producing it cost: `prompt_tokens`,
    `completion_tokens`, `cost_usd`, `attempts` (missing keys are recorded as empty). `trusted` marks candidates
    from trusted compilers (torch.compile): the oracle skips its dispatch-mode runs for them, as it does for
    `CompiledFunctionProvider` (see `forge.checking.validation`).
    """

    name: str = ""
    fn: Callable[..., Any] | None = None
    build: Callable[[int], Callable[..., Any]] | None = None
    failure: Failure | None = None
    error: str | None = None
    usage: Mapping[str, Any] = field(default_factory=dict)
    trusted: bool = False
    code: CandidateCode | None = None

    def __post_init__(self) -> None:
        given = [x is not None for x in (self.fn, self.build, self.failure)]
        if sum(given) != 1:
            raise ValueError("a Candidate holds exactly one of fn (function problem), build (module problem) or "
                             "failure")
        if self.failure is not None:
            object.__setattr__(self, "failure", Failure(self.failure))
            if not isinstance(self.error, str) or not self.error.strip():
                raise ValueError(f"a failed Candidate needs its 'label: detail' error text, got {self.error!r}")

    @classmethod
    def failed(cls, failure: Failure, detail: str, usage: Mapping[str, Any] | None = None,
               name: str = "") -> Candidate:
        """A candidate that does not exist, and why."""
        return cls(name=name, failure=failure, error=failure_text(failure, detail), usage=dict(usage or {}))


class EvalSource(ABC):
    """A source of kernels to evaluate (a static provider, `torch.compile`, the LLM generator...).

    Subclasses implement `name`, `function_candidate` and `module_candidate`; `evaluate` is shared, so every
    source is judged by the same oracle and timed against the same baselines.
    """

    @property
    @abstractmethod
    def name(self) -> str:
        """Short name used in records and reports (e.g. `"compile"`, `"sdpa-flash"`, `"llm:gpt-x"`)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    # -- lifecycle ----------------------------------------------------------------------------------------------
    def start_run(self, run_dir: Path | None, *, resume: bool) -> None:  # noqa: B027 - optional hook
        """Called once in the parent before any worker starts."""

    def for_worker(self, worker_index: int, run_dir: Path | None) -> EvalSource:
        """The copy of this source that worker number `worker_index` (unique per process or task of a run) uses;
        `run_dir` is the run's output folder. Default: a shallow copy. Sources that write files per process
        (an LLM cassette being recorded) give each worker its own file here."""
        return copy.copy(self)

    def setup(self, device: torch.device, kernel_utils: KernelUtils) -> None:  # noqa: B027 - optional hook
        """Build per-process state (called once in each worker process before its first `evaluate`)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release per-process state (called when the worker ends)."""

    def finish_run(self, run_dir: Path | None, *, resume: bool) -> None:  # noqa: B027 - optional hook
        """Called once in the parent after every worker has ended (e.g. to merge per-worker files)."""

    # -- candidates ---------------------------------------------------------------------------------------------
    @abstractmethod
    def function_candidate(self, problem: FunctionProblem, samples: list[Sample], device: torch.device,
                           kernel_utils: KernelUtils) -> Candidate:
        """A replacement for `torch.nn.functional.<problem.function>` on `samples` (unique calls, real tensors on
        `device`), or a failed `Candidate` saying why there is none. Must not raise for a bad candidate."""

    @abstractmethod
    def module_candidate(self, problem: ModuleProblem, device: torch.device, kernel_utils: KernelUtils) -> Candidate:
        """A `build(seed) -> model` for the problem's `ModelNew`, or a failed `Candidate` saying why there is none."""

    # -- evaluation -------------------------------------------------------------------------------------------
    def evaluate(self, problem: Problem, sample_index: int, device: str | torch.device,
                 kernel_utils: KernelUtils | None = None) -> dict[str, Any]:
        """Evaluate one sample of `problem` on `device` and return its record (never raises for a bad candidate).

        See `evals.sources.evaluation.evaluate_problem` for what is checked and measured.
        """
        from evals.sources.evaluation import evaluate_problem

        return evaluate_problem(self, problem, sample_index, device, kernel_utils)
