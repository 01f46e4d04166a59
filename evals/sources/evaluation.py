"""One problem, one sample: get a candidate from a source, have the judge (`forge.judging.Judge`) check it, time it
against eager PyTorch and `torch.compile` in this process, and return the record (`evals.metrics.RECORD_COLUMNS`).

The verdict comes from the judge, as for `make_plan` and the generator: a candidate that is code from a model
(`Candidate.code`, e.g. the LLM source's) is screened and run in the judge's sandbox child with the oracle in this
process; code this process trusts (static providers, `torch.compile`, eager) is judged in process. Function
problems: the calls are drawn on the device (`FunctionProblem.materialize`, seed 0, so every source sees the same
inputs) and judged as `make_plan` judges providers (the problem's tolerance override, when it has one, replaces the
per-dtype floors). Module problems (KernelBench): `ModelNew` against `Model` on several seeds with the judge's seed
and size rules (`forge.judging.modules.check_module`: one seed for inputs, or inputs and outputs, over 1 GiB, or a
reference slower than 8 s on the first seed; the record says `oracle_scaled`).

A correct candidate is then timed here, where it would serve, behind the integrity snapshot and with spot checks of
timed passes (`Judge.time`): function problems on the GCD-reduced call distribution (`benchmark_distribution`;
times are per forward pass of the model: a pass's median scaled by `sum(counts) / calls per pass`), module
problems on one forward of the first seed's `get_inputs()`. The roofline floor comes from `agent.roofline.estimate`
(count-weighted) when the agent package is importable.

Baselines a user would pick: eager (timed before and after the candidate, the faster run kept, as the optimizer and
the sandbox read a baseline); plain `torch.compile` of the function (or of `Model`), timed by the same clock
as the candidate; and, where the clock is host-inclusive (`--timing eager`) on CUDA, eager replayed from a CUDA graph
of one pass (`cuda_graphs_ms`), what a user who graphs the model pays. Each record also says where its time went:
`generation_s` (the source producing the candidate: LLM turns, sandbox checks), `validate_s`, `timing_s` and
`harness_s` (wall time minus generation: everything the harness costs, including the candidate's first-call JIT).

Every record carries `failure` (an `evals.failures.Failure`, None when correct) and `outcome` (the judge's
`forge.outcome.Outcome`, None when no candidate was judged); `failure_reason` is the same, as text for people. Only
third-party exception text is searched, for CUDA faults (`is_cuda_error`): the worker's CUDA context may be gone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch

from evals.failures import DETAIL_CHARS, Failure, failure_text
from evals.problems import FunctionProblem, ModuleProblem, Problem
from evals.sources.base import USAGE_KEYS, Candidate
from forge.checking import DEFAULT_TOLERANCES, BenchmarkResult, KernelUtils, SpotCheckError
from forge.checking.benchmarking import Bracket
from forge.execution import TimingMode
from forge.judging import FunctionTarget, Judge, ModuleTarget, Verdict
from forge.judging.judge import TrustedCall
from forge.judging.modules import ModelCall, ReferenceModel
from forge.outcome import HarnessError, Outcome, issue_of
from forge.samples import Sample
from forge.text import clip

if TYPE_CHECKING:
    from evals.sources.base import EvalSource

__all__ = [
    "CUDA_ERROR_MARKERS",
    "base_record",
    "compile_baseline",
    "plain_compile_baseline",
    "evaluate_problem",
    "fail",
    "failure_record",
    "is_cuda_error",
    "kernel_utils_for",
]

logger = logging.getLogger(__name__)

# Text that marks a CUDA fault which may leave the CUDA context unusable (case-insensitive).
CUDA_ERROR_MARKERS = (
    "cuda error",
    "illegal memory access",
    "device-side assert",
    "unspecified launch failure",
    "misaligned address",
    "illegal instruction was encountered",
    "cudaerrorlaunchfailure",
    "cublas_status_execution_failed",
    "cudnn_status_execution_failed",
    "uncorrectable ecc error",
)
_KEPT_ERRORS = 3
_SEED = 0


# ---------------------------------------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------------------------------------
def is_cuda_error(text: str | None) -> bool:
    """Whether `text` (an exception message or a validation error) reports a CUDA fault."""
    lowered = (text or "").lower()
    return any(marker in lowered for marker in CUDA_ERROR_MARKERS)


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        text += f" (at {frames[-1].filename}:{frames[-1].lineno})"
    return text


def fail(record: dict[str, Any], failure: Failure, detail: str) -> None:
    """Mark `record` as failed for `failure` (its typed `failure`, its `failure_reason` text)."""
    record["correct"] = False
    record["failure"] = failure.value
    record["failure_reason"] = failure_text(failure, detail)


def _fail_exception(record: dict[str, Any], failure: Failure, exc: BaseException) -> None:
    text = _describe(exc)
    fail(record, Failure.DEVICE_FAULT if is_cuda_error(text) else failure, text)


def device_name(device: torch.device) -> str:
    """`torch.cuda.get_device_name` on CUDA, else `"CPU"`."""
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(device)
    return device.type.upper()


def base_record(problem: Problem, sample_index: int, source_name: str, device: str = "") -> dict[str, Any]:
    """The identity fields every record carries, with `compiled`/`correct` False and nothing measured."""
    return {
        "problem_id": problem.id,
        "suite": problem.suite,
        "sample_index": int(sample_index),
        "source": source_name,
        "kind": problem.kind,
        "function": getattr(problem, "function", None),
        "device": str(device),
        "compiled": False,
        "correct": False,
        "failure": None,
        "failure_reason": None,
    }


def failure_record(problem: Problem, sample_index: int, source_name: str, failure: Failure, detail: str, *,
                   device: str = "", wall_s: float | None = None, **extra: Any) -> dict[str, Any]:
    """A record for a sample that produced no result of its own (a worker crash, a timeout...)."""
    record = base_record(problem, sample_index, source_name, device)
    fail(record, failure, detail)
    record.update(outcome=failure.outcome.value if failure.outcome else None, wall_s=wall_s, **extra)
    return record


def _usage_fields(usage: Mapping[str, Any]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for key in USAGE_KEYS:
        value = usage.get(key)
        fields[key] = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if isinstance(usage.get("calls"), int):
        fields["llm_calls"] = usage["calls"]
    if usage.get("cached"):
        fields["cached"] = True
    return fields


# ---------------------------------------------------------------------------------------------------------
# Oracle settings and baselines
# ---------------------------------------------------------------------------------------------------------
def kernel_utils_for(problem: Problem, kernel_utils: KernelUtils) -> KernelUtils:
    """`kernel_utils` with the problem's tolerance override (if any) applied to every dtype."""
    tolerance = getattr(problem, "tolerance", None)
    if tolerance is None:
        return kernel_utils
    table = {dtype: tolerance.as_tuple() for dtype in DEFAULT_TOLERANCES}
    return dataclasses.replace(kernel_utils, tolerances=table)


_COMPILED: dict[str, Any] = {}


_PLAIN_COMPILED: dict[str, Callable[..., Any]] = {}


def plain_compile_baseline(function: str) -> Callable[..., Any]:
    """`torch.compile(torch.nn.functional.<function>, dynamic=False)`, once per function per process: the baseline a
    user would pick. The per-signature `CompiledFunctionProvider` (what `make_plan` uses as a kernel source) paid its
    own guard and lookup on every call: on the H200 it timed 8.3 ms per pass of llama rms_norm (65 calls) where
    eager took 1.08 ms and this plain compile matched eager, so "vs compile" measured our wrapper, not Inductor."""
    from forge.functional import original_function

    compiled = _PLAIN_COMPILED.get(function)
    if compiled is None:
        compiled = _PLAIN_COMPILED[function] = torch.compile(original_function(function), dynamic=False)
    return compiled


def compile_baseline(function: str) -> Any:
    """This process's `CompiledFunctionProvider` for `function` (one per function, so each signature compiles
    once per worker however many problems or sources use it). Not yet prepared for any particular samples."""
    from forge.providers import CompiledFunctionProvider

    provider = _COMPILED.get(function)
    if provider is None:
        provider = _COMPILED[function] = CompiledFunctionProvider(function)
    return provider


# ---------------------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------------------
def evaluate_problem(source: EvalSource, problem: Problem, sample_index: int, device: str | torch.device,
                     kernel_utils: KernelUtils | None = None, judge: Judge | None = None) -> dict[str, Any]:
    """Evaluate one sample of `problem` with `source` on `device` (see the module docstring); never raises for
    anything a candidate or a source does. `judge`: the worker's judge (one is made for this call when None)."""
    started = time.monotonic()
    target = torch.device(device)
    utils = kernel_utils_for(problem, kernel_utils if kernel_utils is not None else KernelUtils())
    own_judge = judge is None
    judge = Judge(utils) if judge is None else judge
    previous, judge.kernel_utils = judge.kernel_utils, utils
    record = base_record(problem, sample_index, source.name, str(target))
    record["timing"] = utils.timing.value
    notes: list[str] = []
    try:
        record["device_name"] = device_name(target)
        if isinstance(problem, FunctionProblem):
            _evaluate_function(source, problem, target, judge, record, notes)
        elif isinstance(problem, ModuleProblem):
            _evaluate_module(source, problem, target, judge, record, notes)
        else:
            fail(record, Failure.UNSUPPORTED, f"unknown problem kind {problem.kind!r}")
    except Exception as exc:  # noqa: BLE001 - a harness failure is recorded, not raised, never charged to the candidate
        logger.warning("evaluating %s failed in the harness", problem.label(),
                       exc_info=not isinstance(exc, HarnessError))
        _fail_exception(record, Failure.HARNESS_ERROR, exc)
        if isinstance(exc, HarnessError):
            record["out_of_memory"] = exc.out_of_memory
    finally:
        judge.kernel_utils = previous
        if own_judge:
            judge.close()
        if target.type == "cuda" and record.get("failure") != Failure.DEVICE_FAULT.value:
            torch.cuda.empty_cache()
    if notes:
        record["notes"] = notes
    if record.get("correct"):
        record["outcome"], record["failure"] = Outcome.OK.value, None
    else:
        failure = Failure(record["failure"]) if record.get("failure") else None
        record["outcome"] = failure.outcome.value if failure is not None and failure.outcome else None
    record["wall_s"] = time.monotonic() - started
    record["harness_s"] = record["wall_s"] - (record.get("generation_s") or 0.0)
    return record


class _Phases:
    """Seconds per phase of one evaluation, written into the record as `<phase>_s` (`generation_s`, `validate_s`,
    `timing_s`); `harness_s` is then the wall time minus generation: what the harness itself costs."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        finally:
            key = f"{phase}_s"
            self.record[key] = (self.record.get(key) or 0.0) + time.monotonic() - start


def _candidate(source: EvalSource, make: Callable[[], Candidate], record: dict[str, Any]) -> Candidate:
    try:
        with _Phases(record)("generation"):
            candidate = make()
    except Exception as exc:  # noqa: BLE001 - a source bug becomes the record's failure
        logger.warning("source %s raised while producing a candidate", source.name, exc_info=True)
        return Candidate.failed(Failure.SOURCE_ERROR, _describe(exc))
    if not isinstance(candidate, Candidate):
        return Candidate.failed(Failure.SOURCE_ERROR, f"{source.name} returned {type(candidate).__name__}, not an "
                                "evals.sources.Candidate")
    return candidate


def _record_verdict(verdict: Verdict, record: dict[str, Any]) -> bool:
    """Fill `compiled` / `failure` / `errors` from the judge's verdict; whether it is correct."""
    if verdict.ok:
        record["compiled"] = True
        return True
    issues = [issue_of(e) for e in verdict.details.get("errors") or ()] or [issue_of(verdict.message)]
    if verdict.details.get("issues"):
        from forge.outcome import ValidationIssue

        issues = [ValidationIssue.from_dict(d) for d in verdict.details["issues"]]
    record["errors"] = [clip(e, DETAIL_CHARS) for e in issues[:_KEPT_ERRORS]]
    record["compiled"] = verdict.status in (Outcome.MISMATCH, Outcome.FORBIDDEN) and \
        verdict.details.get("phase") != "screening"
    if verdict.limit is not None:
        record["harness_limit"] = verdict.limit.value
    raised = next((e for e in issues if e.kind is Outcome.RUNTIME_ERROR), None)
    if verdict.status is Outcome.RUNTIME_ERROR and (is_cuda_error(raised) or verdict.details.get("device_fault")):
        fail(record, Failure.DEVICE_FAULT, raised or verdict.message)
    else:
        fail(record, Failure.of(verdict.status), issues[0] if verdict.status is Outcome.MISMATCH else verdict.message)
        if verdict.status is Outcome.HARNESS_ERROR:
            record.pop("errors", None)  # nothing of the candidate's was found wrong
    if verdict.status is Outcome.HARNESS_ERROR:
        record["out_of_memory"] = bool(verdict.details.get("out_of_memory"))
    return False


def _time(kernel_utils: KernelUtils, fn: Callable[..., Any], samples: list[Sample], what: str,
          notes: list[str]) -> BenchmarkResult | None:
    try:
        return kernel_utils.benchmark(fn, samples)
    except Exception as exc:  # noqa: BLE001 - a baseline that cannot be timed leaves its column empty
        if is_cuda_error(str(exc)):
            raise
        notes.append(failure_text(f"{what} not timed", _describe(exc)))
        logger.info("%s could not be timed: %s", what, exc)
        return None


def _bracketed(first: BenchmarkResult | None, second: BenchmarkResult | None) -> BenchmarkResult | None:
    """Eager timed before and after the candidate, read as the optimizer and the sandbox read a baseline
    (`forge.checking.benchmarking.Bracket`: the faster run), so the eval's speedup is theirs."""
    if first is None or second is None:
        return first or second
    return Bracket(first, second).baseline


def _graphed_eager(utils: KernelUtils, fn: Callable[..., Any], samples: list[Sample], device: torch.device,
                   notes: list[str]) -> BenchmarkResult | None:
    """The third baseline: eager PyTorch replayed from a CUDA graph of one pass, which is what a user who graphs the
    model pays per pass (no host launch cost). Only where timing is host-inclusive on CUDA: in device mode every
    number is already a graph replay, and CPU has no graphs."""
    if utils.timing is not TimingMode.EAGER or device.type != "cuda":
        return None
    return _time(dataclasses.replace(utils, timing=TimingMode.DEVICE), fn, samples, "eager under CUDA graphs", notes)


def _fill_timings(record: dict[str, Any], candidate: BenchmarkResult, eager: BenchmarkResult | None,
                  compiled: BenchmarkResult | None, scale: float, graphed: BenchmarkResult | None = None) -> None:
    latency = candidate.median_ms * scale
    record["latency_ms"] = latency
    record["benchmark_runs"] = candidate.runs
    for column, result in (("eager_ms", eager), ("compile_ms", compiled), ("cuda_graphs_ms", graphed)):
        record[column] = result.median_ms * scale if result is not None else None
    for column, base in (("speedup_eager", record["eager_ms"]), ("speedup_compile", record["compile_ms"]),
                         ("speedup_cuda_graphs", record["cuda_graphs_ms"])):
        if base is None:
            record[column] = None
        elif latency > 0:
            record[column] = base / latency
        else:
            record[column] = math.inf if base > 0 else 1.0



# ---------------------------------------------------------------------------------------------------------
# Function problems
# ---------------------------------------------------------------------------------------------------------
def _roofline(problem: FunctionProblem, calls: list[tuple[int, Sample]], record: dict[str, Any],
              notes: list[str]) -> None:
    try:
        from agent.roofline import estimate
    except ImportError:
        return
    try:
        found = estimate(problem.function, [s for _, s in calls])
    except Exception as exc:  # noqa: BLE001 - the roofline is optional context
        notes.append(failure_text("roofline unavailable", _describe(exc)))
        return
    counts = [c for c, _ in calls]
    rows = found.per_sample
    record["bytes_moved"] = float(sum(c * r.bytes_moved for c, r in zip(counts, rows, strict=True)))
    record["flops"] = float(sum(c * r.flops for c, r in zip(counts, rows, strict=True)))
    record["roofline_floor_ms"] = sum(c * r.floor_ms for c, r in zip(counts, rows, strict=True))
    record["roofline_device"] = found.ceilings.name


def _judge(judge: Judge, candidate: Candidate, target: FunctionTarget | ModuleTarget, callable_: Any) -> Verdict:
    """The judge's verdict: code from a model in the sandbox and then here, where it is timed (`Judge.judge_code`);
    anything else in process."""
    if candidate.code is not None:
        return judge.judge_code(candidate.code, target, callable_)
    return judge.judge_callable(callable_, target, trusted=candidate.trusted)


def _evaluate_function(source: EvalSource, problem: FunctionProblem, device: torch.device, judge: Judge,
                       record: dict[str, Any], notes: list[str]) -> None:
    utils = judge.kernel_utils
    calls = problem.materialize(device, seed=_SEED)
    samples = [sample for _, sample in calls]
    _roofline(problem, calls, record, notes)

    phase = _Phases(record)
    candidate = _candidate(source, lambda: source.function_candidate(problem, samples, device, utils), record)
    record.update(_usage_fields(candidate.usage))
    record["candidate"] = candidate.name or None
    if candidate.failure is not None:
        fail(record, candidate.failure, candidate.error.split(": ", 1)[-1] if candidate.error else "")
        return
    if candidate.fn is None:
        fail(record, Failure.SOURCE_ERROR, f"{source.name} gave a module candidate (build) for a function problem")
        return
    target = FunctionTarget(problem.function, tuple(samples), reference=problem.reference)
    with phase("validate"):
        verdict = _judge(judge, candidate, target, candidate.fn)
    if not _record_verdict(verdict, record):
        return

    fn = TrustedCall(candidate.fn) if candidate.trusted else candidate.fn
    distribution = utils.benchmark_distribution(calls)
    scale = sum(count for count, _ in calls) / len(distribution)
    with phase("timing"):
        eager_first = _time(utils, problem.reference, distribution, "eager", notes)
        try:
            timed = judge.time(fn, distribution, reference=problem.reference)
        except SpotCheckError as exc:  # a timed pass's output differs from the reference
            fail(record, Failure.MISMATCH, str(exc))
            return
        except Exception as exc:  # noqa: BLE001 - a kernel that fails when timed is not usable
            _fail_exception(record, Failure.BENCHMARK_ERROR, exc)
            return
        record["correct"] = True
        eager = _bracketed(eager_first, _time(utils, problem.reference, distribution, "eager", notes))
        compiled = _time(utils, plain_compile_baseline(problem.function), distribution, "torch.compile", notes)
        graphed = _graphed_eager(utils, problem.reference, distribution, device, notes)
    _fill_timings(record, timed, eager, compiled, scale, graphed)


# ---------------------------------------------------------------------------------------------------------
# Module problems
# ---------------------------------------------------------------------------------------------------------
def _evaluate_module(source: EvalSource, problem: ModuleProblem, device: torch.device, judge: Judge,
                     record: dict[str, Any], notes: list[str]) -> None:
    utils = judge.kernel_utils
    phase = _Phases(record)
    candidate = _candidate(source, lambda: source.module_candidate(problem, device, utils), record)
    record.update(_usage_fields(candidate.usage))
    record["candidate"] = candidate.name or None
    if candidate.failure is not None:
        fail(record, candidate.failure, candidate.error.split(": ", 1)[-1] if candidate.error else "")
        return
    if candidate.build is None:
        fail(record, Failure.SOURCE_ERROR, f"{source.name} gave a function candidate (fn) for a module problem")
        return
    target = ModuleTarget(problem.module_source, str(device))
    with phase("validate"):
        verdict = _judge(judge, candidate, target, candidate.build)
    if not _record_verdict(verdict, record):
        return
    if verdict.details.get("oracle_scaled"):
        record["oracle_scaled"] = True
        notes.append(str(verdict.details.get("note") or verdict.details["oracle_scaled"]))
    seed = target.seeds[0]
    with phase("timing"):
        reference_model, inputs = problem.instantiate(device, seed)
        try:
            model = ModelCall(candidate.build(seed), trusted=candidate.trusted)
        except Exception as exc:  # noqa: BLE001 - it was built for the verdict: a failure now is the candidate's
            _fail_exception(record, Failure.BENCHMARK_ERROR, exc)
            return
        pass_samples = [Sample(tuple(inputs), {})]
        eager_first = _time(utils, reference_model, pass_samples, "eager", notes)
        try:
            timed = judge.time(model, pass_samples, reference=ReferenceModel(reference_model))
        except SpotCheckError as exc:  # a timed forward's output differs from Model's
            fail(record, Failure.MISMATCH, str(exc))
            return
        except Exception as exc:  # noqa: BLE001
            _fail_exception(record, Failure.BENCHMARK_ERROR, exc)
            return
        record["correct"] = True
        eager = _bracketed(eager_first, _time(utils, reference_model, pass_samples, "eager", notes))
        compiled = None
        try:
            compiled_model = torch.compile(reference_model)
            compiled = _time(utils, compiled_model, pass_samples, "torch.compile", notes)
        except Exception as exc:  # noqa: BLE001
            notes.append(failure_text("torch.compile not timed", _describe(exc)))
        graphed = _graphed_eager(utils, reference_model, pass_samples, device, notes)
    _fill_timings(record, timed, eager, compiled, 1.0, graphed)
