"""`KernelOptimizer`: profile a module, try every kernel source per hot function, keep the fastest correct one.

Flow of `make_plan` (the reference design's, with its weak points fixed):
1. profile the module's forward (functional calls intercepted only inside it) and rank functions by time;
2. select functions per source by time share (providers and generators have separate thresholds);
3. submit every generator task first (asynchronous; the generation clock starts now);
4. while they run, prepare and judge every static provider;
5. collect generated results as they finish until the timeout, judging each (unfinished tasks are cancelled
   and named);
6. per function, once generation is over, time PyTorch, then every valid candidate, then PyTorch again, and keep
   the fastest candidate only when it beats both baseline runs by more than the measured noise;
7. time the whole model with and without the selected kernels, the way it will run, in paired interleaved blocks,
   and keep the plan only when it is significantly faster, dropping entries one at a time until it is or nothing
   remains (`forge.end_to_end.check_plan`; the report says what was dropped and why).
`make_plan(..., execution=)` says how the model will run (`forge.execution`): `eager` selects on host-inclusive
time, `cuda_graphs` and `compile` on device time (a CUDA-graph replay: launch cost vanishes there), and the
end-to-end check runs the model that way. The plan records the mode.
Every candidate, static or generated, is judged by the same `forge.judging.Judge` (a provider that carries code,
such as a generated kernel, in its sandbox and then, passed there, here where the plan will run it: `judge_code`;
static providers in process), then timed by `KernelUtils.benchmark` here. `judge=` shares a judge (e.g. the
generator's) instead of making one.
Timing waits for step 6 on purpose: on the H200, a generated softmax timed at 3.2x PyTorch in its sandbox measured
only 1.05x when timed in the optimizer while other sandbox children were validating on the same GPU.
A failing provider or generator is reported and skipped; it never breaks the plan. Report statuses are
`ReportStatus` values: a candidate the oracle rejects is `mismatch` or `runtime_error` (`forge.outcome.Outcome`);
one whose output on a timed pass differs from the reference (`forge.checking.spot_check`, checked while it is timed
in step 6) is `mismatch` too, its error naming the spot check, the pass and the worst error, and is never selected;
a failure of the harness (the reference raising or running out of memory in `validate`, the PyTorch baseline failing
to be timed) is `harness_error`, never charged to the candidate. Candidate code (a provider's `prepare` and calls, a
generator's `prepare`/`submit`/result, a generated provider's attributes) runs inside `forge.outcome`'s containment:
its `SystemExit`, `GeneratorExit` or self-raised `KeyboardInterrupt` is recorded as `runtime_error` (the error names
the type) and `make_plan` goes on; the user's Ctrl-C (a real SIGINT) and interrupts raised by the harness propagate.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import pandas as pd
import torch
from torch import nn

from forge.checking import BenchmarkResult, KernelUtils
from forge.checking.benchmarking import Bracket, NotCapturableError, record_inside_capture, samples_device
from forge.checking.integrity import Snapshot
from forge.checking.spot_check import SpotCheckError
from forge.end_to_end import ModelRunner, PlanCheck, check_plan, time_model
from forge.env import env_float
from forge.environment import environment_fingerprint
from forge.errors import KernelForgeError
from forge.execution import DEVICE_BOUND_SHARE, ClockChoice, Execution, TimingMode, clock_for, parse_execution
from forge.functional import functional_names, original_function
from forge.judging import FunctionTarget, InstanceTarget, Judge, JudgeOptions, Verdict, default_concurrency
from forge.judging.modules import WeightGuard, restored_if_written
from forge.modules import (
    MODULE_PREFIX,
    ModuleCalls,
    ModuleKernelProvider,
    class_aliases,
    class_name,
    declared_layer,
    recorded_calls,
)
from forge.outcome import (
    CandidateAbort,
    CandidateCall,
    HarnessError,
    Outcome,
    candidate_code,
    outcome_of_exception,
    watch_interrupts,
)
from forge.plan import KernelOptimizationPlan, PlanEntry
from forge.profiler import ModuleFunctionKernelProfiler, normalize_data
from forge.profiler.interception import CallRecorder, ModuleScopedInterception
from forge.profiler.modules import ModuleProfile, Reach, profile_modules
from forge.progress import Stopwatch, progress
from forge.provider import KernelGenerationResult, KernelGenerator, KernelProvider
from forge.providers.compiled_function import CompiledFunctionProvider
from forge.providers.graphed_module import GraphedModuleProvider
from forge.samples import Sample
from forge.text import clip

__all__ = ["KernelOptimizer", "DEFAULT_GENERATION_TIMEOUT_S", "PlanResult", "REPORT_COLUMNS", "ReportStatus"]

logger = logging.getLogger(__name__)

DEFAULT_GENERATION_TIMEOUT_S = 21600.0
GENERATION_TIMEOUT_ENV = "KFORGE_GENERATION_TIMEOUT"
REPORT_COLUMNS = ["function", "candidate", "source", "status", "outcome", "latency_ms", "spread", "speedup", "error"]


class ReportStatus(StrEnum):
    """The `status` column of `KernelOptimizer.report`."""

    BASELINE = "baseline"
    SELECTED = "selected"
    VALID = "valid"  # correct and faster than PyTorch, but not the fastest
    SLOWER = "slower"
    NOT_SIGNIFICANT = "not significant"  # the fastest, but not beyond the noise
    DROPPED = "dropped (not faster end to end)"
    PREPARE_REFUSED = "prepare_refused"
    NOT_CAPTURABLE = "not_capturable"
    INVALID = "invalid"  # a generator returned an unusable provider
    FAILED = "failed"  # a generator failed (not a candidate)
    GENERATION_FAILED = "generation_failed"
    TIMEOUT = "timeout"
    # The judge's verdicts on a candidate that was not correct (`forge.outcome.Outcome` values; the report's
    # `outcome` column holds the Outcome itself for every judged candidate).
    MISMATCH = Outcome.MISMATCH.value
    RUNTIME_ERROR = Outcome.RUNTIME_ERROR.value
    COMPILE_ERROR = Outcome.COMPILE_ERROR.value
    FORBIDDEN = Outcome.FORBIDDEN.value
    CRASH = Outcome.CRASH.value
    HARNESS_ERROR = Outcome.HARNESS_ERROR.value


# The judge's outcome behind each report status (None: a row that is not a judged candidate, e.g. the baseline).
_OUTCOME_OF_STATUS = {
    **{status: Outcome.OK for status in ("selected", "valid", "slower", "not significant",
                                         "dropped (not faster end to end)")},
    **{status: Outcome(status) for status in ("mismatch", "runtime_error", "compile_error", "forbidden", "crash",
                                               "harness_error", "timeout")},
    "not_capturable": Outcome.RUNTIME_ERROR,
}


def _aborted(exc: BaseException) -> str:
    return f"{exc} (contained: the candidate tried to end the process)" if isinstance(exc, CandidateAbort) else \
        f"{type(exc).__name__}: {exc}"


def default_generation_timeout() -> float:
    """`$KFORGE_GENERATION_TIMEOUT` in seconds (default 21600); ValueError naming the variable when it is not a
    finite number >= 0."""
    value = env_float(GENERATION_TIMEOUT_ENV, DEFAULT_GENERATION_TIMEOUT_S, minimum=0, what="a number of seconds")
    assert value is not None
    return value


# A class is a module target from this share of the kernel time in its own glue (outside F calls). Measured on the
# H200 (BENCHMARKS K6): the SD-1.5 UNet's glue is spread over classes of 1.5-2.4% each (ResnetBlock2D,
# BasicTransformerBlock, GEGLU, Transformer2DModel); at 3% none was a target and a plan could reach 90.8% of the
# kernel time, at 1% 98.9% (Llama 99.7%, ViT 98.6%), and compiled forwards of those classes took the UNet's plan
# from 1.000x to 1.045x under CUDA graphs.
MODULE_MIN_SHARE_PERCENT = 1.0
_DECLARED_LAYER_SHARE = 1.0  # percent of the kernel time a declared swappable layer needs to be a module target
_BACKBONE_SHARE = 0.5  # a module called once per pass that holds more of the kernel time than this is the model
# A block replayed from a CUDA graph in eager execution (`GraphedModuleProvider`) from this share of the kernel time:
# each replay costs a few host calls (inputs in, replay, outputs out), so only blocks of many launches gain.
_GRAPH_BLOCK_SHARE = 1.0


def _timing_failure(exc: Exception) -> tuple[ReportStatus, str]:
    """The report row of a candidate whose timing raised: the status its exception's type means
    (`forge.outcome.outcome_of_exception`; a kernel that cannot be captured in a CUDA graph has its own status) and
    the error text. A spot check that failed is `mismatch`; the reference failing on the timed inputs is the
    harness's; anything else the candidate raised is its `runtime_error`."""
    if isinstance(exc, NotCapturableError):
        return ReportStatus.NOT_CAPTURABLE, str(exc)
    outcome = outcome_of_exception(exc)
    if isinstance(exc, KernelForgeError) and not isinstance(exc, CandidateAbort):
        return ReportStatus(outcome.value), str(exc) if outcome is not Outcome.HARNESS_ERROR else \
            f"{type(exc).__name__}: {exc}"
    return ReportStatus(outcome.value), f"benchmark raised {_aborted(exc)}"


def _nested(a: nn.Module, b: nn.Module) -> bool:
    """Whether one of the two modules contains the other (or they are the same)."""
    return a is b or any(m is b for m in a.modules()) or any(m is a for m in b.modules())


def _as_list(value: Any, kind: type, label: str) -> list:
    if value is None:
        return []
    items = [value] if isinstance(value, kind) else list(value)
    for item in items:
        if not isinstance(item, kind):
            raise TypeError(f"{label} must be {kind.__name__} instances, got {type(item).__name__}: {item!r}")
    return items


def _check_percent(name: str, value: float) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number between 0 and 100, got {value!r}") from None
    if not (0.0 <= number <= 100.0):  # also rejects NaN
        raise ValueError(f"{name} must be between 0 and 100, got {value!r}")
    return number


@dataclass
class _Run:
    """The state of one `make_plan` call (a fresh one per call; the optimizer keeps only its settings)."""

    execution: Execution
    compile_options: dict[str, Any]
    timing_utils: KernelUtils
    rows: list[dict[str, Any]] = field(default_factory=list)
    profile_summary: pd.DataFrame | None = None
    module_profile: ModuleProfile | None = None
    module_targets: tuple[str, ...] = ()
    graph_blocks: tuple[str, ...] = ()
    module_deadline: float = math.inf  # time.monotonic() when module conversations must end (generation_timeout)
    clock: ClockChoice | None = None
    end_to_end: pd.DataFrame | None = None
    plan_check: PlanCheck | None = None
    selected_entries: tuple[PlanEntry, ...] = ()

    @property
    def report(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=REPORT_COLUMNS)


@dataclass(frozen=True)
class PlanResult:
    """Everything one `make_plan` found (`KernelOptimizer.optimize`): the plan; `report`, one row per candidate
    (status, outcome, latency, speedup, error); `profile_summary`, time per function; `module_profile`, kernel time
    by module class, and `module_targets`, the classes module kernels were sought for (qualified names);
    `graph_blocks`, the blocks tried replayed from CUDA graphs (eager on CUDA: `GraphedModuleProvider`); `clock`,
    how kernels were compared; `end_to_end` and `plan_check`, the whole-model check; `selected_entries`, the
    per-function winners before that check."""

    plan: KernelOptimizationPlan
    report: pd.DataFrame
    profile_summary: pd.DataFrame | None = None
    module_profile: ModuleProfile | None = None
    module_targets: tuple[str, ...] = ()
    graph_blocks: tuple[str, ...] = ()
    clock: ClockChoice | None = None
    end_to_end: pd.DataFrame | None = None
    plan_check: PlanCheck | None = None
    selected_entries: tuple[PlanEntry, ...] = ()

    @property
    def reach(self) -> Reach | None:
        """The share of the kernel time this run could reach (F calls and module targets), when profiled by module."""
        return self.module_profile.reach(self.module_targets) if self.module_profile is not None else None


def _never_served(runners: Sequence[ModelRunner]) -> dict[int, str]:
    """The module entries that no planned run of the end-to-end check served (by id), with why
    (`KernelProviderRuntime.unserved`)."""
    unserved: dict[int, str] = {}
    served: set[int] = set()
    for runner in runners:
        runtime = runner.runtime
        if runtime is None:
            continue
        missed = {id(entry): why for entry, why in runtime.unserved()}
        unserved.update(missed)
        served.update(id(entry) for entry in runtime.module_entries if id(entry) not in missed)
    return {key: why for key, why in unserved.items() if key not in served}


def _judging_time(verdict: Verdict) -> str:
    """Where a judgement's seconds went, for the progress line: the sandbox child (its start-up, the oracle's calls)
    and this process's oracle run, when the judge recorded them."""
    details = verdict.details
    if "sandbox_s" not in details:
        return f"{verdict.wall_s:.1f} s"
    phases = details.get("phase_s") or {}
    inner = ", ".join(f"{k.removeprefix('child_')} {float(v):.1f}" for k, v in phases.items() if float(v) >= 0.05)
    ahead = ", judged ahead beside the class's other groups" if details.get("judged_ahead") else ""
    return (f"{verdict.wall_s:.1f} s (sandbox {float(details['sandbox_s']):.1f} s"
            f"{': ' + inner if inner else ''}{ahead}; here {float(details['in_process_s']):.1f} s)")


@dataclass(frozen=True)
class _ModuleTry:
    """One module source tried on one behaviour group: the provider once prepared (its code, for the class's other
    groups), the entry when it won, and whether it was judged correct."""

    provider: ModuleKernelProvider | None = None
    entry: PlanEntry | None = None
    judged: bool = False


@dataclass
class _Candidate:
    provider: KernelProvider
    source: str
    description: str
    result: BenchmarkResult | None = None


@dataclass
class _FunctionSearch:
    name: str
    reference: Callable
    unique_samples: list[Sample]
    benchmark_samples: list[Sample]
    candidates: list[_Candidate] = field(default_factory=list)


@dataclass
class _GenerationTask:
    function: str
    generator: KernelGenerator
    future: cf.Future


class KernelOptimizer:
    """Profiles a module and builds a `KernelOptimizationPlan` from static providers and generators."""

    def __init__(
        self,
        kernel_providers: KernelProvider | Sequence[KernelProvider] | None = None,
        kernel_generators: KernelGenerator | Sequence[KernelGenerator] | None = None,
        kernel_profiler_factory: Callable[..., ModuleFunctionKernelProfiler] = ModuleFunctionKernelProfiler,
        kernel_utils: KernelUtils | None = None,
        provider_min_time_share_percent: float = 0.0,
        generator_min_time_share_percent: float = 10.0,
        generation_timeout: float | None = None,
        *,
        end_to_end_check: bool = True,
        end_to_end_blocks: int = 8,
        judge: Judge | None = None,
        module_sources: Sequence[Callable[[str], ModuleKernelProvider]] | None = None,
        module_min_time_share_percent: float = MODULE_MIN_SHARE_PERCENT,
        module_classes: Sequence[str] | None = None,
        graph_blocks: bool = True,
    ) -> None:
        self.kernel_providers: list[KernelProvider] = _as_list(kernel_providers, KernelProvider, "kernel_providers")
        self.kernel_generators: list[KernelGenerator] = _as_list(
            kernel_generators, KernelGenerator, "kernel_generators"
        )
        self.kernel_profiler_factory = kernel_profiler_factory
        self.kernel_utils = kernel_utils if kernel_utils is not None else KernelUtils()
        self.judge = judge if judge is not None else Judge(self.kernel_utils,
                                                            JudgeOptions(max_concurrent=default_concurrency()))
        self.provider_min_time_share_percent = _check_percent(
            "provider_min_time_share_percent", provider_min_time_share_percent
        )
        self.generator_min_time_share_percent = _check_percent(
            "generator_min_time_share_percent", generator_min_time_share_percent
        )
        if generation_timeout is None:
            generation_timeout = default_generation_timeout()
        if not isinstance(generation_timeout, (int, float)) or not generation_timeout >= 0:
            raise ValueError(f"generation_timeout must be a number of seconds >= 0, got {generation_timeout!r}")
        self.generation_timeout = float(generation_timeout)
        self.end_to_end_check = bool(end_to_end_check)
        if isinstance(end_to_end_blocks, bool) or not isinstance(end_to_end_blocks, int) or end_to_end_blocks < 5:
            raise ValueError(f"end_to_end_blocks must be an int >= 5 (the sign test over fewer blocks can never show "
                             f"a win at the 5% level), got {end_to_end_blocks!r}")
        self.end_to_end_blocks = end_to_end_blocks
        # Module kernels (forge.modules): a factory per source, called with a qualified class name (one with a
        # `serves_class(qualified_name) -> bool` method is asked only for the classes it serves: a kept file written
        # for one class); the classes tried are those whose own forwards hold at least this share of the kernel time
        # outside F calls.
        self.module_sources = list(module_sources or [])
        self.module_min_time_share_percent = _check_percent("module_min_time_share_percent",
                                                            module_min_time_share_percent)
        # Only these classes (qualified or bare names, e.g. "LlamaRMSNorm"), when given: a user who knows where the
        # glue is, or a run that must not spend LLM conversations on the rest.
        self.module_classes = frozenset(module_classes) if module_classes is not None else None
        # In eager execution on CUDA, the model's outermost blocks are also tried replayed from CUDA graphs
        # (`forge.providers.graphed_module`): the launches of a host-bound forward paid once per block.
        self.graph_blocks = bool(graph_blocks)
        self._run = _Run(Execution.EAGER, {}, self.kernel_utils)  # the state of one make_plan call
        self.last_result: PlanResult | None = None  # what the last make_plan found (`PlanResult`)

    # -- what the last make_plan found (read-only views of its run; `last_result` is the frozen record) ---------
    report = property(lambda self: self._run.report, doc="Every candidate: status, outcome, latency, error.")
    profile_summary = property(lambda self: self._run.profile_summary, doc="Time per function of the model.")
    module_profile = property(lambda self: self._run.module_profile, doc="Kernel time by module class.")
    module_targets = property(lambda self: self._run.module_targets,
                              doc="The module classes module kernels were sought for (qualified names).")
    clock = property(lambda self: self._run.clock, doc="The selection clock and the measurements behind it.")
    end_to_end = property(lambda self: self._run.end_to_end, doc="The end-to-end check's table.")
    plan_check = property(lambda self: self._run.plan_check, doc="The end-to-end check (`PlanCheck`).")
    selected_entries = property(lambda self: self._run.selected_entries,
                                doc="The entries selected per function, before the end-to-end check.")
    _execution = property(lambda self: self._run.execution)
    _compile_options = property(lambda self: self._run.compile_options)
    _timing_utils = property(lambda self: self._run.timing_utils)

    @property
    def _rows(self) -> list[dict[str, Any]]:
        return self._run.rows

    @_rows.setter
    def _rows(self, rows: list[dict[str, Any]]) -> None:
        self._run.rows = rows

    # -- sources ------------------------------------------------------------------------------------------
    def _providers_for(self, name: str) -> list[KernelProvider]:
        return [p for p in self.kernel_providers if p.supported_function == name]

    def _generator_functions(self, generator: KernelGenerator) -> set[str]:
        try:
            return set(generator.supports_functions())
        except Exception:
            logger.warning("generator %s failed to list its functions; skipping it", generator, exc_info=True)
            return set()

    # -- public -------------------------------------------------------------------------------------------
    def make_plan(
        self,
        function: Callable,
        data: Sequence[Any] | None = None,
        *,
        module: nn.Module | None = None,
        execution: Execution | str = Execution.EAGER,
        compile_options: dict[str, Any] | None = None,
    ) -> KernelOptimizationPlan:
        """Profile `function(*sample)` for each sample of `data` inside `module` and return the best plan for running
        it as `execution` (`"eager"`, `"cuda_graphs"` or `"compile"`; `compile_options` go to `torch.compile` in the
        end-to-end check)."""
        return self.optimize(function, data, module=module, execution=execution,
                             compile_options=compile_options).plan

    def optimize(
        self,
        function: Callable,
        data: Sequence[Any] | None = None,
        *,
        module: nn.Module | None = None,
        execution: Execution | str = Execution.EAGER,
        compile_options: dict[str, Any] | None = None,
    ) -> PlanResult:
        """`make_plan`, returning everything it found as one frozen `PlanResult` (the plan, the candidates'
        report, the profiles, the selection clock and the end-to-end check); also kept as `last_result`."""
        with watch_interrupts():  # tells a candidate's own KeyboardInterrupt from the user's Ctrl-C
            plan = self._make_plan(function, data, module=module, execution=execution,
                                   compile_options=compile_options)
        run = self._run
        self.last_result = PlanResult(plan=plan, report=run.report, profile_summary=run.profile_summary,
                                      module_profile=run.module_profile, module_targets=run.module_targets,
                                      graph_blocks=run.graph_blocks, clock=run.clock,
                                      end_to_end=run.end_to_end, plan_check=run.plan_check,
                                      selected_entries=run.selected_entries)
        return self.last_result

    def _make_plan(
        self,
        function: Callable,
        data: Sequence[Any] | None,
        *,
        module: nn.Module | None,
        execution: Execution | str,
        compile_options: dict[str, Any] | None,
    ) -> KernelOptimizationPlan:
        execution = parse_execution(execution)
        if module is None:
            if isinstance(function, nn.Module):
                module = function
            else:
                raise ValueError(
                    "module must be given when function is not an nn.Module: call make_plan(fn, data, module=model)"
                )
        if not isinstance(module, nn.Module):
            raise ValueError(f"module must be an nn.Module, got {type(module).__name__}")
        self._run = _Run(execution, dict(compile_options or {}),
                         dataclasses.replace(self.kernel_utils, timing=execution.timing_mode))
        clock = Stopwatch()

        generator_support = {id(g): self._generator_functions(g) for g in self.kernel_generators}
        provider_names = {p.supported_function for p in self.kernel_providers}
        generator_names = set().union(*generator_support.values()) if generator_support else set()
        # Module kernels, or blocks replayed from CUDA graphs (eager on CUDA), may take what no F call holds.
        by_module = bool(self.module_sources) or (self.graph_blocks and execution is Execution.EAGER
                                                  and torch.cuda.is_available())
        if not self.kernel_providers and not self.kernel_generators and not by_module:
            logger.info("No kernel sources configured: returning an empty plan.")
            return KernelOptimizationPlan(environment=environment_fingerprint(), execution=execution)
        supported = provider_names | generator_names
        if not supported and not by_module:
            logger.info("No supported kernel functions: returning an empty plan.")
            return KernelOptimizationPlan(environment=environment_fingerprint(), execution=execution)

        progress("profiling %s", type(module).__name__)
        profiler = self.kernel_profiler_factory(function_names=supported)
        profile = profiler.profile(function, data, module=module)
        summary = profile.summary()
        device = getattr(profile, "device", None)
        if summary.empty and not by_module:  # module kernels may still take the glue
            logger.info("No torch.nn.functional calls found inside the module: returning an empty plan.")
            self._run.profile_summary = summary
            return KernelOptimizationPlan(environment=environment_fingerprint(device), execution=execution)

        self._run.module_profile = self._profile_modules(function, data, module, profile)
        self._run.graph_blocks = self._graph_block_classes(module, device)
        self._run.clock = self._choose_clock(function, data, module, profile, execution)
        self._run.timing_utils = dataclasses.replace(self.kernel_utils, timing=self.clock.timing)
        progress("selection clock: %s (%s)", self.clock.timing.value, self.clock.reason)
        self._tell_generators(execution, self.clock.timing)

        pct = dict(zip(summary["function_name"], summary["time_spent_pct"], strict=True))
        ranked = [n for n in summary["function_name"] if n in profile.functions and profile.functions[n].samples]
        provider_functions = [
            n for n in ranked if n in provider_names and pct[n] >= self.provider_min_time_share_percent
        ]
        generator_functions = [
            n for n in ranked if n in generator_names and pct[n] >= self.generator_min_time_share_percent
        ]
        marked = summary.copy()
        marked["provider"] = ["✓" if n in provider_functions else "" for n in marked["function_name"]]
        marked["generator"] = ["✓" if n in generator_functions else "" for n in marked["function_name"]]
        self._run.profile_summary = marked
        logger.info("Profile summary:\n%s", marked.to_string(index=False, float_format=lambda v: f"{v:.3f}"))

        chosen = [name for name in ranked if name in provider_functions or name in generator_functions]
        captured = (self._captured_function_calls(function, data, module, set(chosen))
                    if chosen and execution is Execution.CUDA_GRAPHS and device == "cuda" else {})
        searches: dict[str, _FunctionSearch] = {}
        for name in ranked:
            if name in provider_functions or name in generator_functions:
                counted = captured.get(name) or profile.functions[name].samples
                searches[name] = _FunctionSearch(
                    name=name,
                    reference=original_function(name),
                    unique_samples=[s for _, s in counted],
                    benchmark_samples=self.kernel_utils.benchmark_distribution(counted),
                )

        tasks = self._submit_generation(searches, generator_functions, generator_support)
        generation_deadline = time.monotonic() + self.generation_timeout
        self._evaluate_providers(searches, provider_functions)
        self._collect_generated(searches, tasks, generation_deadline)
        entries = self._select(searches)
        entries += self._module_entries(function, data, module, device)
        self._run.selected_entries = tuple(entries)  # before the end-to-end check
        if entries and self.end_to_end_check:
            entries = self._check_end_to_end(function, data, module, entries)
        plan = KernelOptimizationPlan(entries=tuple(entries), environment=environment_fingerprint(device),
                                      execution=execution)

        if not self.report.empty:
            logger.info("Candidates:\n%s", self.report.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        progress("plan ready in %s: %d function(s) replaced", clock, len(plan))
        return plan

    # -- phases -------------------------------------------------------------------------------------------
    def _profile_modules(self, function: Callable, data: Sequence[Any] | None, module: nn.Module,
                         profile: Any) -> ModuleProfile | None:
        """Kernel time by module class (`forge.profiler.modules`): the hot classes beside the hot functions."""
        samples = normalize_data(data) or [Sample((), {})]
        runner = ModelRunner(module, samples, function=function)
        device = torch.device("cuda") if getattr(profile, "device", "cpu") == "cuda" else samples_device(samples)
        try:
            found = profile_modules(runner, module, device=device)
        except Exception as exc:  # noqa: BLE001 - a report, never a reason to stop
            logger.warning("profiling by module failed (%s); the plan is made without it", exc)
            return None
        finally:
            runner.close()
        logger.info("Hot module classes:\n%s", found.hot().to_string(index=False, float_format=lambda v: f"{v:.3f}"))
        return found

    # -- module kernels (forge.modules) --------------------------------------------------------------------
    def _module_classes(self, module: nn.Module) -> list[str]:
        """Target names of the classes worth a module kernel, hottest glue first (not the model's own class)."""
        if not self.module_sources or self.module_profile is None:
            return []
        frame = self.module_profile.frame.sort_values("outside_f_ms", ascending=False)
        root, total = class_name(module), self.module_profile.total_ms
        # A class called once per pass that holds most of the model (a backbone such as LlamaModel) is not a hot
        # module: compiling it is `--execution compile`, not a kernel.
        # A class its library declares swappable (transformers' `use_kernel_forward_from_hub("RMSNorm")`: the layers
        # the ecosystem already writes kernels for) is a target from a smaller share of its own.
        return [MODULE_PREFIX + row.module_class for row in frame.itertuples()
                if row.module_class != root
                and (row.outside_f_pct >= self.module_min_time_share_percent
                     or (declared_layer(row.module_class) is not None and row.self_pct >= _DECLARED_LAYER_SHARE
                         and row.outside_f_pct > 0))
                and not (row.calls <= 1 and row.inclusive_ms > _BACKBONE_SHARE * total)
                and self._module_wanted(row.module_class)]

    def _tell_generators(self, execution: Execution, timing: TimingMode) -> None:
        """How the model will run and the clock the selection uses, told once per plan to every generator and to every
        module source that takes them (`use_execution`, `use_clock`), before any function or module generation: a
        generator timing on another clock would keep, and ask the model for, what this selection does not want."""
        told: set[int] = set()
        for target in [*self.kernel_generators, *self.module_sources]:
            if id(target) in told:
                continue
            told.add(id(target))
            for hook, value in (("use_execution", execution), ("use_clock", timing)):
                method = getattr(target, hook, None)
                if method is None:
                    continue
                try:
                    with candidate_code():
                        method(value)
                except Exception as exc:  # noqa: BLE001 - the generator keeps its own clock, said in the log
                    logger.warning("%s.%s(%s) failed: %s", target, hook, value, _aborted(exc))

    def _captured_function_calls(self, function: Callable, data: Sequence[Any] | None, module: nn.Module,
                                 names: set[str]) -> dict[str, list[tuple[int, Sample]]]:
        """`(calls per pass, sample)` per signature of the F calls named, recorded inside a CUDA-graph capture
        (`record_inside_capture`), for a plan made for `cuda_graphs`: the profile records them eagerly, and a library
        may call a function otherwise inside a capture (transformers up to 5.17 gives attention an explicit causal
        mask there), so a kernel judged on the eager calls would never serve. Empty when the model cannot be
        captured (logged): the eager calls then."""
        recorder = CallRecorder(names)
        runner = ModelRunner(module, normalize_data(data) or [Sample((), {})], function=function)
        try:
            record_inside_capture(runner, ModuleScopedInterception(module, recorder, functional_names()))
        except Exception as exc:  # noqa: BLE001 - the eager calls then
            logger.warning("the model cannot be captured in a CUDA graph (%s: %s); its F calls are judged on the "
                           "eager calls", type(exc).__name__, exc)
            return {}
        finally:
            runner.close()
        return {name: [(count, s.clone())  # out of the graph's memory pool
                       for count, s in zip(recorder.counts(name), recorder.samples(name), strict=True)]
                for name in names if recorder.samples(name)}

    def _graph_block_classes(self, module: nn.Module, device: str | None) -> tuple[str, ...]:
        """Qualified names of the model's outermost blocks (`ModuleProfile.outermost_blocks`), tried replayed from
        CUDA graphs (`GraphedModuleProvider`) when the model runs eagerly on CUDA; found once per plan
        (`_Run.graph_blocks`)."""
        profile = self.module_profile
        if not self.graph_blocks or self._execution is not Execution.EAGER or profile is None or device != "cuda":
            return ()
        return tuple(profile.outermost_blocks(module, _GRAPH_BLOCK_SHARE, _BACKBONE_SHARE))

    def _graph_block_share(self) -> float:
        """The share of the kernel time inside this plan's blocks (`_Run.graph_blocks`; 0 when none), for the
        selection clock (`forge.execution.clock_for`)."""
        profile = self.module_profile
        if not self._run.graph_blocks or profile is None or profile.total_ms <= 0:
            return 0.0
        frame = profile.frame
        inside = frame.loc[frame["module_class"].isin(self._run.graph_blocks), "inclusive_ms"].sum()
        return float(inside) / profile.total_ms

    def _module_wanted(self, qualified: str) -> bool:
        """Whether `module_classes` (when given) names the class: qualified, bare, or by its declared layer name."""
        if self.module_classes is None:
            return True
        return bool(class_aliases(qualified) & self.module_classes)

    def _module_entries(self, function: Callable, data: Sequence[Any] | None, module: nn.Module,
                        device: str | None = None) -> list[PlanEntry]:
        """Judge and time module kernels for the hot classes, hottest first; instances inside (or around) ones
        already replaced are skipped."""
        blocks = [MODULE_PREFIX + name for name in self._run.graph_blocks]
        wanted = self._module_classes(module)
        self._run.module_targets = tuple(name[len(MODULE_PREFIX):] for name in wanted)
        if not wanted and not blocks:
            return []
        # Module conversations share one generation_timeout of their own, from here (function kernels had theirs).
        self._run.module_deadline = time.monotonic() + self.generation_timeout
        samples = normalize_data(data) or [Sample((), {})]
        runner = ModelRunner(module, samples, function=function)
        try:
            found = recorded_calls(runner, module, set(wanted) | set(blocks),
                                   captured=self._execution is Execution.CUDA_GRAPHS and device == "cuda")
        finally:
            runner.close()
        # Blocks first: a graphed block replays whatever the plan runs inside it (the module kernels below are
        # captured into its graph when the plan runs), so the classes inside stay targets; a class graphed as a
        # block is not also given a module kernel (one replacement per instance).
        entries: list[PlanEntry] = []
        graphed: set[str] = set()
        for name in blocks:
            calls = found.get(name)
            if calls is not None:
                won = self._class_entries(name, calls, [], [GraphedModuleProvider])
                entries += won
                graphed.update(entry.function for entry in won)
        taken: list[nn.Module] = []
        for name in wanted:
            calls = found.get(name)
            if calls is None or name in graphed:
                continue
            instances = [m for group in calls.instances.values() for m in group]
            if any(_nested(m, t) for m in instances for t in taken):
                logger.info("%s: its instances sit inside (or around) a class already tried; skipped", name)
                continue
            try:
                entries += self._class_entries(name, calls, taken, self.module_sources)
            finally:
                self.judge.forget_ahead()
        return entries

    def _class_entries(self, name: str, calls: ModuleCalls, taken: list[nn.Module],
                       sources: Sequence[Callable[[str], ModuleKernelProvider]]) -> list[PlanEntry]:
        """Every behaviour group of one class, each served by the fastest correct source (appended to `taken`).
        Code a source wrote for one group is judged in the sandbox on all the later groups at once
        (`Judge.judge_ahead`) before their turn comes."""
        groups = list(calls.instances.items())
        targets = [InstanceTarget.of(group[0], calls.samples[key], calls.counts[key]) for key, group in groups]
        written: dict[int, ModuleKernelProvider] = {}  # per source: code it wrote for an earlier group
        ahead: set[int] = set()  # sources whose code was judged ahead on the later groups
        entries: list[PlanEntry] = []
        for number, (key, group) in enumerate(groups, start=1):
            if len(groups) > 1:  # a class of many groups is long work: say where it stands
                progress("%s: behaviour group %d of %d (%d instance(s))", name, number, len(groups), len(group))
            won = []
            for index, source in enumerate(sources):
                serves = getattr(source, "serves_class", None)
                if serves is not None and not serves(name[len(MODULE_PREFIX):]):
                    continue
                if index in written and index not in ahead:
                    ahead.add(index)
                    self._judge_ahead(name, written[index], targets, number)
                tried = self._module_try(name, source, written.get(index), group, targets[number - 1],
                                         calls.samples[key], calls.counts[key])
                # Code judged correct here serves as the later groups' first try; so does a kept file judged wrong
                # here (its source gives the same file again): either way it is judged on them all at once next.
                if tried.judged or (tried.provider is not None and not tried.provider.rewrites):
                    written[index] = tried.provider
                if tried.entry is not None:
                    won.append(tried.entry)
            if won:  # every source is judged and timed; the fastest serves the group
                entries.append(min(won, key=lambda e: e.latency_ms))
                taken += group
        return entries

    def _judge_ahead(self, name: str, earlier: ModuleKernelProvider, targets: list[InstanceTarget],
                     number: int) -> None:
        """The sandbox verdicts of the code `earlier` wrote, on the class's groups from `number` (1-based) on,
        several children at a time (nothing else runs on the device meanwhile); each group's own judging then uses
        its verdict."""
        sibling = earlier.sibling()
        code = sibling.candidate_code() if sibling is not None else None
        later = targets[number - 1:]
        if code is None or not later:
            return
        progress("%s: judging %s on the %d other group(s) in the sandbox, %d at a time", name, sibling.name,
                 len(later), min(self.judge.options.max_concurrent, len(later)))

        def heard(index: int, verdict: Verdict) -> None:
            progress("%s: %s on group %d of %d: %s (%.1f s)", name, sibling.name, number + index, len(targets),
                     verdict.status.value, verdict.wall_s)

        started = time.monotonic()
        verdicts = self.judge.judge_ahead(code, later, kernel_utils=self.kernel_utils, on_verdict=heard)
        progress("%s: %d sandbox verdict(s) in %.1f s", name, sum(v is not None for v in verdicts),
                 time.monotonic() - started)

    def _module_try(self, name: str, source: Callable[[str], ModuleKernelProvider],
                    earlier: ModuleKernelProvider | None, instances: list[nn.Module], target: InstanceTarget,
                    samples: list[Sample], counts: list[int]) -> _ModuleTry:
        """One source for one behaviour group of a class. Code the source wrote for another group of the class
        (`ModuleKernelProvider.sibling`: a `ModelNew` file) is judged on this group first, so a class whose
        instances differ only in a plain attribute (Llama's sixteen `LlamaAttention`s, one `layer_idx` each) costs
        one conversation, not sixteen; only when it is not correct here does the source write another."""
        sibling = earlier.sibling() if earlier is not None else None
        if sibling is not None:
            tried = self._module_candidate(name, lambda: sibling, sibling.name, instances, target, samples, counts)
            if tried.judged:
                return _ModuleTry(earlier, tried.entry, True)
            if not earlier.rewrites:  # a kept file: asking its source again gives the same file
                return _ModuleTry(earlier)
            progress("%s: %s is not correct for another group of instances; asking its source again", name,
                     sibling.name)
        return self._module_candidate(name, lambda: source(name[len(MODULE_PREFIX):]), str(source), instances,
                                      target, samples, counts)

    def _module_candidate(self, name: str, make: Callable[[], ModuleKernelProvider], label: str,
                          instances: list[nn.Module], target: InstanceTarget, samples: list[Sample],
                          counts: list[int]) -> _ModuleTry:
        """One class's instances of one behaviour (`instance_key`): prepare, judge against the original forward
        (float64 on an upcast copy of the instance: `ReferenceModel`), time between two baseline runs."""
        representative = instances[0]
        try:
            with candidate_code():
                provider = make()
                progress("%s: preparing %s", name, provider.name)
                with self._module_generation_bound(provider) as timed_out:
                    ready = provider.prepare_instances(instances, samples, counts)
        except Exception as exc:  # noqa: BLE001 - reported
            self._row(name, label, "static", ReportStatus.RUNTIME_ERROR, error=f"prepare raised {_aborted(exc)}")
            return _ModuleTry()
        kind = "generated" if type(provider).carries_code else "static"
        if timed_out.is_set():
            self._row(name, provider.name, kind, ReportStatus.TIMEOUT,
                      error=f"module conversations not finished within {self.generation_timeout:.1f}s")
            return _ModuleTry()
        if not ready:
            why = getattr(provider, "error", None) or "cannot serve these calls"
            status = ReportStatus.GENERATION_FAILED if kind == "generated" else ReportStatus.PREPARE_REFUSED
            self._row(name, provider.name, kind, status, error=why)
            return _ModuleTry()
        # Every candidate gets the live instance, and must not write to it; generated code's weights are also copied
        # aside and put back if it did.
        with restored_if_written(representative, restore=kind == "generated") as weights:
            entry, judged = self._judged_module_entry(name, provider, kind, instances, target, samples, counts,
                                                      weights)
        return _ModuleTry(provider, entry, judged)

    @contextlib.contextmanager
    def _module_generation_bound(self, provider: ModuleKernelProvider) -> Iterator[threading.Event]:
        """While a provider that writes its code when prepared (a conversation: `writes_on_prepare`) prepares,
        cancel it when the module generation time (`module_deadline`) is up; the event says whether it was."""
        fired = threading.Event()
        if not provider.writes_on_prepare:
            yield fired
            return
        remaining = self._run.module_deadline - time.monotonic()

        def stop() -> None:
            fired.set()
            provider.cancel()

        if remaining <= 0:
            stop()
            yield fired
            return
        timer = threading.Timer(remaining, stop)
        timer.daemon = True
        timer.start()
        try:
            yield fired
        finally:
            timer.cancel()

    def _judged_module_entry(self, name: str, provider: ModuleKernelProvider, kind: str, instances: list[nn.Module],
                             target: InstanceTarget, samples: list[Sample], counts: list[int],
                             weights: WeightGuard) -> tuple[PlanEntry | None, bool]:
        """Judge one prepared module provider on the group's first instance (`target`), then time it
        (`_module_candidate`); `weights` watches the instance's tensors from before the replacement was built.
        Returns the entry (None unless it won) and whether it was judged correct."""
        representative = instances[0]
        original = functools.partial(type(representative).forward, representative)
        progress("%s: judging %s", name, provider.name)
        try:
            with candidate_code():  # building the replacement runs its constructor
                bound = provider.bind(representative)
                code = provider.candidate_code()
            if code is not None:  # in the sandbox, then (passed there) here, where the plan will run it
                verdict = self.judge.judge_code(code, target, bound, kernel_utils=self.kernel_utils)
            else:
                trusted = not getattr(provider, "allows_dispatch_poisoning", True)
                verdict = self.judge.judge_callable(bound, target, trusted=trusted, kernel_utils=self.kernel_utils)
        except HarnessError as exc:
            self._row(name, provider.name, kind, ReportStatus.HARNESS_ERROR, error=f"{type(exc).__name__}: {exc}")
            return None, False
        except Exception as exc:  # noqa: BLE001 - the replacement could not be built (e.g. it copies parameters)
            self._row(name, provider.name, kind, ReportStatus.INVALID, error=f"cannot be bound: {_aborted(exc)}")
            return None, False
        if not verdict.ok:
            errors = verdict.details.get("errors") or [verdict.message]
            self._row(name, provider.name, kind, ReportStatus(verdict.status.value),
                      error="; ".join(map(str, errors[:3])))
            return None, False
        progress("%s: %s judged correct in %s", name, provider.name, _judging_time(verdict))
        utils = self._timing_utils
        own = getattr(provider, "timed_on", None)  # a source whose gain only one clock sees (a graphed block)
        if own is not None and own is not utils.timing:
            utils = dataclasses.replace(self.kernel_utils, timing=own)
        timed = self.kernel_utils.benchmark_distribution(list(zip(counts, samples, strict=True)))
        try:
            first = utils.benchmark(original, timed)
            with candidate_code():
                result = utils.benchmark(bound, timed, reference=original)
            second = utils.benchmark(original, timed)
            written = weights.changed()
            if written:
                self._row(name, provider.name, kind, ReportStatus.FORBIDDEN,
                          error=f"wrote to the instance's {', '.join(written[:5])} while built or timed")
                return None, False
        except SpotCheckError as exc:
            self._row(name, provider.name, kind, ReportStatus.MISMATCH, error=str(exc))
            return None, False
        except Exception as exc:  # noqa: BLE001 - reported
            self._row(name, provider.name, kind, ReportStatus.RUNTIME_ERROR, error=f"benchmark raised {exc}")
            return None, False
        bracket = Bracket(first, second)
        baseline = bracket.baseline
        self._row(name, f"{type(representative).__name__}.forward (PyTorch)", "baseline", ReportStatus.BASELINE,
                  baseline, baseline=baseline)
        won = bracket.beaten_by(result)
        status = ReportStatus.SELECTED if won else (
            ReportStatus.SLOWER if result.median_ms >= baseline.median_ms else ReportStatus.NOT_SIGNIFICANT)
        self._row(name, provider.name, kind, status, result, baseline=baseline)
        if not won:
            return None, True
        return PlanEntry(provider=provider, signatures=tuple(samples), source=kind, latency_ms=result.median_ms,
                         baseline_ms=baseline.median_ms,
                         description=f"{provider.name} for {len(instances)} instance(s)"), True

    def _choose_clock(self, function: Callable, data: Sequence[Any] | None, module: nn.Module, profile: Any,
                      execution: Execution) -> ClockChoice:
        """The clock kernels are selected by (`forge.execution.clock_for`): in eager on CUDA, one short host-inclusive
        timing of the model next to the profile's kernel time tells device-bound from host-bound."""
        device_ms = getattr(profile, "total_time_ms", None)
        if execution is not Execution.EAGER or getattr(profile, "device", "cpu") != "cuda":
            return clock_for(execution, device_ms, None) if execution is not Execution.EAGER else ClockChoice(
                execution.timing_mode, device_ms, None, "eager on the CPU: one clock")
        graphed = self._graph_block_share()
        if graphed >= DEVICE_BOUND_SHARE:  # no timing of the model needed
            return clock_for(execution, device_ms, None, graphed)
        samples = normalize_data(data) or [Sample((), {})]
        runner = ModelRunner(module, samples, function=function)
        try:
            wall = time_model(runner, execution=execution, device=samples_device(samples), rounds=5,
                              min_run_time_s=0.0, warmup=1)
        except Exception as exc:  # noqa: BLE001 - the default clock then
            logger.warning("could not time the model to choose a clock (%s); selecting on host-inclusive time", exc)
            return clock_for(execution, device_ms, None)
        finally:
            runner.close()
        return clock_for(execution, device_ms, wall.median_ms)

    def _timed_reference(self, search: _FunctionSearch) -> tuple[Callable[..., Any], str]:
        """What a candidate must beat: eager PyTorch, or under `compile` what Inductor makes of the same call (a
        replacement there displaces Inductor's code for the region, not the eager op)."""
        if self._execution is not Execution.COMPILE:
            return search.reference, "PyTorch (eager)"
        compiled = CompiledFunctionProvider(search.name)
        try:
            with torch.no_grad():
                ready = compiled.prepare(search.unique_samples)
        except Exception as exc:  # noqa: BLE001 - falls back to eager, said in the log
            logger.info("Inductor cannot compile %s alone (%s); its baseline is eager", search.name, exc)
            ready = False
        return (compiled, "PyTorch (Inductor)") if ready else (search.reference, "PyTorch (eager)")

    def _submit_generation(
        self,
        searches: dict[str, _FunctionSearch],
        generator_functions: list[str],
        support: dict[int, set[str]],
    ) -> list[_GenerationTask]:
        tasks = []
        for name in generator_functions:
            search = searches[name]
            for generator in self.kernel_generators:
                if name not in support[id(generator)]:
                    continue
                try:
                    with candidate_code():
                        ready = generator.prepare(name, search.unique_samples)
                        future = generator.submit(name, search.unique_samples) if ready else None
                    if future is None:
                        self._row(name, str(generator), "generated", ReportStatus.PREPARE_REFUSED,
                                  error="generator declined")
                        continue
                except CandidateAbort as exc:
                    logger.warning("Generator %s tried to end the process for %s: %s", generator, name, exc)
                    self._row(name, str(generator), "generated", ReportStatus.RUNTIME_ERROR, error=_aborted(exc))
                    continue
                except Exception as exc:
                    logger.warning("Generator %s failed to start for %s: %s", generator, name, exc, exc_info=True)
                    self._row(name, str(generator), "generated", ReportStatus.FAILED, error=_aborted(exc))
                    continue
                progress("generation started: %s for %s", generator, name)
                tasks.append(_GenerationTask(name, generator, future))
        return tasks

    def _evaluate_providers(self, searches: dict[str, _FunctionSearch], provider_functions: list[str]) -> None:
        total = sum(len(self._providers_for(n)) for n in provider_functions)
        done = 0
        for name in provider_functions:
            search = searches[name]
            for provider in self._providers_for(name):
                done += 1
                progress("[%d/%d] %s: preparing %s", done, total, name, provider.name)
                try:
                    with torch.no_grad(), candidate_code():
                        ready = provider.prepare(search.unique_samples)
                except Exception as exc:
                    logger.warning("Provider %s failed to prepare for %s: %s", provider.name, name, exc)
                    self._row(name, provider.name, "static", ReportStatus.RUNTIME_ERROR,
                              error=f"prepare raised {_aborted(exc)}")
                    continue
                if not ready:
                    self._row(name, provider.name, "static", ReportStatus.PREPARE_REFUSED,
                              error="provider cannot serve these samples")
                    continue
                self._evaluate(search, provider, "static", provider.name)

    def _collect_generated(
        self, searches: dict[str, _FunctionSearch], tasks: list[_GenerationTask], deadline: float
    ) -> None:
        if not tasks:
            return
        by_future = {t.future: t for t in tasks}
        remaining = max(0.0, deadline - time.monotonic())
        progress("waiting for %d generation task(s) (timeout %.0fs)", len(tasks), remaining)
        try:
            for future in cf.as_completed(list(by_future), timeout=remaining):
                task = by_future.pop(future)
                self._evaluate_generation(searches[task.function], task, future)
        except (TimeoutError, cf.TimeoutError):
            names = [f"{t.generator} for {t.function}" for t in by_future.values()]
            logger.warning(
                "Kernel generation timed out after %.1f seconds; cancelling %d unfinished task(s): %s",
                self.generation_timeout,
                len(names),
                ", ".join(names),
            )
            for task in by_future.values():
                task.future.cancel()
                self._row(task.function, str(task.generator), "generated", ReportStatus.TIMEOUT,
                          error=f"not finished within {self.generation_timeout:.1f}s")
            for generator in {id(t.generator): t.generator for t in by_future.values()}.values():
                try:
                    generator.cancel()
                except Exception:
                    logger.warning("Generator %s failed to cancel", generator, exc_info=True)

    def _evaluate_generation(self, search: _FunctionSearch, task: _GenerationTask, future: cf.Future) -> None:
        label = str(task.generator)
        failure = None if future.cancelled() else future.exception(timeout=0)
        if failure is not None and not isinstance(failure, Exception):  # SystemExit etc. in the generation thread
            logger.warning("Kernel generation in %s for %s raised %s", label, search.name, type(failure).__name__)
            self._row(search.name, label, "generated", ReportStatus.RUNTIME_ERROR,
                      error=_aborted(CandidateAbort(failure)))
            return
        try:
            result = future.result(timeout=0)
        except Exception as exc:
            logger.warning("Kernel generation failed in %s for %s: %s", label, search.name, exc)
            self._row(search.name, label, "generated", ReportStatus.FAILED, error=f"{type(exc).__name__}: {exc}")
            return
        if not isinstance(result, KernelGenerationResult):
            self._row(search.name, label, "generated", ReportStatus.FAILED,
                      error=f"future returned {type(result).__name__}")
            return
        if not result.succeeded:
            logger.warning("Generator %s produced no candidate for %s: %s", label, search.name, result.error)
            status = (ReportStatus.HARNESS_ERROR if result.outcome == Outcome.HARNESS_ERROR
                      else ReportStatus.GENERATION_FAILED)
            self._row(search.name, label, "generated", status, error=result.error)
            return
        provider = result.provider
        try:
            with candidate_code():  # a generated provider's attributes run its code
                problem = self._unusable(provider, result, search.name)
        except Exception as exc:
            problem = (ReportStatus.RUNTIME_ERROR if isinstance(exc, CandidateAbort) else ReportStatus.INVALID,
                       f"provider is not usable: {_aborted(exc)}")
        if problem is not None:
            self._row(search.name, label, "generated", problem[0], error=problem[1])
            return
        self._evaluate(search, provider, "generated", result.description or f"{label}: {provider.name}")

    @staticmethod
    def _unusable(provider: KernelProvider, result: KernelGenerationResult,
                  name: str) -> tuple[ReportStatus, str] | None:
        if provider.supported_function != name or result.function != name:
            return ReportStatus.INVALID, f"generator returned a provider for {provider.supported_function!r}"
        if not provider.is_ready:
            return ReportStatus.INVALID, "generated provider is not ready"
        try:
            provider.to_dict()
        except Exception as exc:
            return ReportStatus.INVALID, f"provider is not serialisable: {exc}"
        return None

    def _evaluate(self, search: _FunctionSearch, provider: KernelProvider, source: str, description: str) -> None:
        """Judge now (`forge.judging.Judge`: a provider that carries code in the sandbox, any other in process);
        timing waits for `_select`, when no generator or sandbox child shares the device."""
        name = search.name
        target = FunctionTarget(name, tuple(search.unique_samples), reference=search.reference)
        progress("%s: judging %s", name, provider.name)
        try:
            with candidate_code():  # a generated provider's attributes run its code
                code = provider.candidate_code()
            if code is not None:  # in the sandbox, then (passed there) here, where the plan will run it
                verdict = self.judge.judge_code(code, target, CandidateCall(provider), kernel_utils=self.kernel_utils)
            else:
                verdict = self.judge.judge_callable(provider, target, kernel_utils=self.kernel_utils)
        except Exception as exc:  # the judge contains the candidate: what escapes is the harness's failure
            logger.warning("The harness failed judging %s (not the candidate's fault): %s", description, exc,
                           exc_info=not isinstance(exc, HarnessError))
            self._row(name, provider.name, source, ReportStatus.HARNESS_ERROR, error=f"{type(exc).__name__}: {exc}")
            return
        if not verdict.ok:
            errors = verdict.details.get("errors") or [verdict.message]
            logger.info("%s was judged %s: %s", description, verdict.status.value, errors[:3])
            self._row(name, provider.name, source, ReportStatus(verdict.status.value),
                      error="; ".join(map(str, errors[:3])))
            return
        search.candidates.append(_Candidate(provider, source, description))

    def _select(self, searches: dict[str, _FunctionSearch]) -> list[PlanEntry]:
        """Time every valid candidate between two baseline runs and keep the fastest that beats both beyond noise."""
        entries = []
        for name, search in searches.items():
            if not search.candidates:
                continue
            try:
                utils = self._timing_utils
                progress("%s: benchmarking PyTorch and %d candidate(s) (%s time)", name, len(search.candidates),
                         utils.timing.value)
                baseline_fn, baseline_label = self._timed_reference(search)
                first = utils.benchmark(baseline_fn, search.benchmark_samples)
                judge = Snapshot.take()  # F and the references too: a candidate patching them while timed fails
                timed: list[_Candidate] = []
                for c in search.candidates:
                    try:
                        c.result = utils.benchmark(CandidateCall(c.provider), search.benchmark_samples,
                                                   reference=search.reference)
                        judge.check(f"while timing {c.provider.name}")
                    except Exception as exc:  # wrong on a timed pass, patched the judge, not capturable, raised...
                        status, error = _timing_failure(exc)
                        logger.warning("Timing %s: %s (%s)", c.description, status.value, error)
                        self._row(name, c.provider.name, c.source, status, error=error)
                        continue
                    timed.append(c)
                second = utils.benchmark(baseline_fn, search.benchmark_samples)
            except Exception as exc:  # PyTorch itself could not be timed: not the candidates' fault
                logger.warning("Baseline benchmark failed for %s: %s", name, exc)
                for c in search.candidates:
                    self._row(name, c.provider.name, c.source, ReportStatus.HARNESS_ERROR,
                              error=f"baseline failed: {exc}")
                continue
            bracket = Bracket(first, second)
            baseline = bracket.baseline
            self._row(name, baseline_label, "baseline", ReportStatus.BASELINE, baseline, baseline=baseline)
            if not timed:
                continue
            ranked = sorted(timed, key=lambda c: c.result.median_ms)
            best = ranked[0]
            chosen = best if bracket.beaten_by(best.result) else None
            for c in ranked:
                if c is chosen:
                    status = ReportStatus.SELECTED
                elif c.result.median_ms >= baseline.median_ms:
                    status = ReportStatus.SLOWER
                elif c is best:
                    status = ReportStatus.NOT_SIGNIFICANT
                else:
                    status = ReportStatus.VALID
                self._row(name, c.provider.name, c.source, status, c.result, baseline=baseline)
            if chosen is not None:
                entries.append(
                    PlanEntry(
                        provider=chosen.provider,
                        signatures=tuple(search.unique_samples),
                        source=chosen.source,
                        latency_ms=chosen.result.median_ms,
                        baseline_ms=baseline.median_ms,
                        description=chosen.description,
                    )
                )
        return entries

    def _check_end_to_end(
        self, function: Callable, data: Sequence[Any] | None, module: nn.Module, entries: list[PlanEntry]
    ) -> list[PlanEntry]:
        """Time the whole `function` over `data` with and without the plan, run the way the plan's execution mode
        runs it, and keep only what makes the model faster (`forge.end_to_end.check_plan`: paired interleaved
        blocks against the better neighbouring baseline, a sign test, entries dropped one at a time).

        Per-call timings isolate a kernel (L2 flushed, device idle before each pass), so they miss costs that only
        show inside the model: host-side launch overhead that stalls the queue, layouts later ops copy, fusions
        Inductor can no longer make. A failure of the check itself keeps nothing: an unchecked plan is not shipped.
        """
        samples = normalize_data(data) or [Sample((), {})]
        execution = self._execution
        device = samples_device(samples)
        target = function if execution is not Execution.COMPILE else module
        runners: list[ModelRunner] = []
        utils = self.kernel_utils

        def measure(selected: Sequence[PlanEntry]) -> Callable[[], float]:
            plan = KernelOptimizationPlan(entries=tuple(selected), execution=execution) if selected else None
            with candidate_code():  # building a planned runner loads the kernels
                runner = ModelRunner(module, samples, execution=execution, plan=plan,
                                     compile_options=self._compile_options, function=target)
            runners.append(runner)

            def block() -> float:
                with candidate_code():  # the selected kernels run inside the model here
                    return time_model(runner, execution=execution, device=device, rounds=utils.rounds,
                                      min_run_time_s=utils.min_run_time_s, warmup=utils.warmup).median_ms
            return block

        progress("end-to-end check (%s): the model with and without the plan", execution.value)
        try:
            check = check_plan(entries, measure, execution=execution, blocks=self.end_to_end_blocks,
                               saving=lambda e: (e.baseline_ms or 0.0) - (e.latency_ms or 0.0))
        except Exception as exc:  # noqa: BLE001 - reported; nothing unchecked is kept
            logger.warning("End-to-end check failed (%s); keeping no entry", exc, exc_info=True)
            for entry in entries:
                self._mark_dropped(entry, f"the end-to-end check failed: {type(exc).__name__}: {exc}")
            return []
        finally:
            never = _never_served(runners)
            for runner in runners:
                runner.close()
        self._run.end_to_end = check.frame()
        self._run.plan_check = check
        logger.info("End-to-end check:\n%s", self.end_to_end.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        # An entry the model never called with a judged signature saved nothing, whatever the timing said: that is
        # what its row says, and it is not kept.
        kept = []
        for entry, why in [*((e, None) for e in check.kept), *check.dropped]:
            if id(entry) in never:
                logger.warning("%s (%s) never served in the model, so it is not kept: %s", entry.function,
                               entry.description or entry.provider.name, never[id(entry)])
                self._mark_dropped(entry, f"never served in the model: {never[id(entry)]}")
            elif why is None:
                kept.append(entry)
            else:
                self._mark_dropped(entry, why)
        return kept

    def _mark_dropped(self, entry: PlanEntry, why: str) -> None:
        for row in self._rows:
            if row["function"] == entry.function and row["status"] == ReportStatus.SELECTED:
                row["status"] = ReportStatus.DROPPED
                row["error"] = why

    # -- report -------------------------------------------------------------------------------------------
    def _row(
        self,
        function: str,
        candidate: str,
        source: str,
        status: ReportStatus,
        result: BenchmarkResult | None = None,
        *,
        baseline: BenchmarkResult | None = None,
        error: str | None = None,
    ) -> None:
        self._rows.append(
            {
                "function": function,
                "candidate": candidate,
                "source": source,
                "status": ReportStatus(status),
                "outcome": _OUTCOME_OF_STATUS.get(ReportStatus(status)),
                "latency_ms": result.median_ms if result is not None else None,
                "spread": result.spread if result is not None else None,
                "speedup": (baseline.median_ms / result.median_ms) if result is not None and baseline else None,
                "error": error,
            }
        )
        if status is not ReportStatus.BASELINE:  # a long run shows each verdict as it comes, not only at the end
            row = self._rows[-1]
            speed = f" {row['speedup']:.3g}x" if row["speedup"] is not None else ""
            progress("%s: %s -> %s%s%s", function, candidate, row["status"].value, speed,
                     f" ({clip(error, 300)})" if error else "")

