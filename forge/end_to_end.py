"""Whole-model timing of a plan in every way a model runs: eager, CUDA graphs and `torch.compile`, each with and
without the plan, interleaved, with each variant's output checked against eager.

Why interleaved blocks: on the shared H200 host the same eager forward measured 2.97-4.69 ms across calls of one
session, so variants timed one after another compare the host's mood, not the plan. Each block times every variant
once (`forge.checking.benchmark`); a row reports the median of the block medians and the inter-quartile range of
all passes.

How each variant is timed is how it runs in production (`forge.execution`):
- `eager` / `eager + plan`: host-inclusive passes (`TimingMode.EAGER`);
- `CUDA graphs` / `CUDA graphs + plan`: one pass captured in a CUDA graph and replayed (`TimingMode.DEVICE`) — the
  same capture a serving loop does with `torch.cuda.graph`; CUDA only;
- `torch.compile` / `torch.compile + plan`: `torch.compile(model)` called as a user calls it, host-inclusive. The
  plan variant compiles its own deep copy of the model so that Dynamo's caches for the two variants never mix.

`KernelOptimizer.make_plan` checks a plan with `check_plan`, in the plan's execution mode: the model with the plan
against the better of two runs without it (timed just before and just after, in each block), over interleaved
blocks, and a plan is kept only when it is faster in significantly many blocks (`PairedComparison`, a one-sided sign
test); otherwise entries are dropped one at a time (the one whose removal leaves the fastest model) until what
remains wins or nothing remains. Why a paired test: on the H200 host the eager Llama forward's q25-q75 spanned
14.6-25.3 ms in one run, and the previous rule (prune only when BOTH baselines were significantly faster) kept plans
it had measured at 0.82x, because one slow baseline was enough to keep a loser. (Those numbers were also host launch
times: whole-model timings took their device from empty samples, BENCHMARKS.md K1; `time_model` passes it now.)
The six-variant report (`compare_end_to_end`) uses the same per-block ratio, so the two agree in direction.
"""

from __future__ import annotations

import copy
import logging
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch
from torch import nn

from forge.checking.benchmarking import BenchmarkResult, benchmark, samples_device, summarize
from forge.execution import Execution, TimingMode, parse_execution
from forge.profiler.kernels import COMPILED, GRAPH, KernelDiff, KernelProfile, profile_kernels
from forge.progress import progress
from forge.samples import Sample, clone_value, iter_tensors

if TYPE_CHECKING:
    from forge.plan import KernelOptimizationPlan

__all__ = ["EndToEndReport", "ModelRunner", "PairedComparison", "PlanCheck", "VariantResult", "check_plan",
           "compare_end_to_end", "sign_test_p", "time_model"]

logger = logging.getLogger(__name__)

REPORT_COLUMNS = ["variant", "execution", "plan", "median_ms", "q25_ms", "q75_ms", "runs", "speedup_vs_eager",
                  "speedup_vs_same_mode", "blocks_won", "max_abs_error", "correct", "note"]


class ModelRunner:
    """Runs `function` (default: the model) once per sample the way `execution` runs it, with `plan` applied when
    given, and returns the outputs; `close()` removes what it installed. For `compile` with a plan the model is
    deep-copied (before the plan is applied: a planned module's forward wrapper must not be copied) and the plan stays
    applied to the copy, so the compiled code of the two variants never mixes and activation is not switched per call
    (each switch would re-trace); eager and CUDA-graph runs apply the plan only inside each call."""

    def __init__(
        self,
        model: nn.Module,
        samples: Sequence[Sample],
        *,
        execution: Execution | str = Execution.EAGER,
        plan: KernelOptimizationPlan | None = None,
        compile_options: Mapping[str, Any] | None = None,
        function: Callable[..., Any] | None = None,
    ) -> None:
        self.execution = parse_execution(execution)
        self.samples = list(samples)
        planned = plan is not None and len(plan) > 0
        target: nn.Module = model
        call: Callable[..., Any] = function if function is not None else model
        if self.execution is Execution.COMPILE:
            if function is not None and function is not model:
                raise ValueError("compile execution times the module itself: call make_plan(model, data) with the "
                                 "nn.Module, not a wrapper function")
            target = copy.deepcopy(model) if planned else model
            call = torch.compile(target, **dict(compile_options or {}))
        self.runtime = plan.runtime(target) if planned else None
        self._persistent = self.execution is Execution.COMPILE and self.runtime is not None
        if self._persistent:
            self.runtime.activate()
        self.call = call
        self.__name__ = f"{self.execution.value}{' + plan' if planned else ''}"

    def __call__(self, *, clone: bool = False) -> list[Any]:
        """One pass over the samples; `clone=True` copies each output before the next call (under
        `mode="reduce-overhead"` a later call overwrites the outputs of the one before)."""
        if self.runtime is None or self._persistent:
            return self._run(clone)
        with self.runtime.applied():
            return self._run(clone)

    def _run(self, clone: bool) -> list[Any]:
        outputs = []
        for sample in self.samples:
            if self.execution is Execution.COMPILE:
                torch.compiler.cudagraph_mark_step_begin()  # a new iteration for cudagraph trees (no-op otherwise)
            output = self.call(*sample.args, **sample.kwargs)
            outputs.append(clone_value(output) if clone else output)
        return outputs

    def close(self) -> None:
        if self.runtime is not None:
            self.runtime.deactivate()


def time_model(
    run: Callable[[], Any],
    *,
    execution: Execution | str,
    device: torch.device,
    rounds: int = 10,
    min_run_time_s: float = 0.05,
    warmup: int = 2,
) -> BenchmarkResult:
    """One timing of `run` (a `ModelRunner`) with the clock `execution` runs under (CUDA graphs: device mode)."""
    execution = parse_execution(execution)
    mode = TimingMode.DEVICE if execution is Execution.CUDA_GRAPHS and device.type == "cuda" else TimingMode.EAGER
    return benchmark(lambda: run(), [Sample((), {})], rounds=rounds, min_run_time_s=min_run_time_s, warmup=warmup,
                     mode=mode, flush_l2=device.type == "cuda", device=device)


def sign_test_p(wins: int, blocks: int) -> float:
    """One-sided sign test: the chance of at least `wins` wins in `blocks` fair coin flips."""
    if blocks <= 0:
        return 1.0
    return sum(math.comb(blocks, k) for k in range(max(wins, 0), blocks + 1)) / 2.0**blocks


@dataclass(frozen=True)
class PairedComparison:
    """The model with a plan against it without, block by block: each block's baseline is the better of the runs
    timed next to the planned run (before and after it), so drift within a block favours no side.

    `speedup`: the median of the per-block ratios (baseline / plan). `wins`: blocks where the plan was faster.
    `faster()`: significantly faster (sign test at `alpha`, and a median gain over `min_gain`)."""

    baseline_ms: tuple[float, ...]
    plan_ms: tuple[float, ...]

    @property
    def blocks(self) -> int:
        return len(self.plan_ms)

    @property
    def ratios(self) -> tuple[float, ...]:
        return tuple(b / p if p > 0 else math.inf for b, p in zip(self.baseline_ms, self.plan_ms, strict=True))

    @property
    def speedup(self) -> float:
        return statistics.median(self.ratios) if self.ratios else math.nan

    @property
    def wins(self) -> int:
        return sum(r > 1.0 for r in self.ratios)

    @property
    def p_value(self) -> float:
        return sign_test_p(self.wins, self.blocks)

    def faster(self, alpha: float = 0.05, min_gain: float = 0.0) -> bool:
        return self.blocks > 0 and self.p_value < alpha and self.speedup > 1.0 + min_gain

    def describe(self) -> str:
        return (f"{self.speedup:.3f}x, faster in {self.wins} of {self.blocks} blocks (sign test p={self.p_value:.3g}; "
                f"median {statistics.median(self.plan_ms):.4g} ms with the plan, "
                f"{statistics.median(self.baseline_ms):.4g} ms without)")


@dataclass(frozen=True)
class PlanCheck:
    """What `check_plan` kept and dropped, with every comparison it made (`frame()` is the printable table)."""

    kept: tuple[Any, ...]
    dropped: tuple[tuple[Any, str], ...]  # (entry, why)
    trials: tuple[tuple[str, tuple[str, ...], PairedComparison, str], ...]  # (label, functions, comparison, verdict)
    execution: Execution

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame([
            {"variant": label, "execution": self.execution.value, "functions": ", ".join(functions),
             "median_ms": statistics.median(c.plan_ms), "baseline_ms": statistics.median(c.baseline_ms),
             "speedup": c.speedup, "blocks_won": f"{c.wins}/{c.blocks}", "p_value": c.p_value, "verdict": verdict}
            for label, functions, c, verdict in self.trials
        ], columns=PLAN_CHECK_COLUMNS)


PLAN_CHECK_COLUMNS = ["variant", "execution", "functions", "median_ms", "baseline_ms", "speedup", "blocks_won",
                      "p_value", "verdict"]


def check_plan(
    entries: Sequence[Any],
    measure: Callable[[Sequence[Any]], Callable[[], float]],
    *,
    execution: Execution,
    blocks: int = 8,
    alpha: float = 0.05,
    min_gain: float = 0.0,
    saving: Callable[[Any], float] | None = None,
    leave_one_out_limit: int = 4,
) -> PlanCheck:
    """Keep the entries that make the whole model faster, the way it runs (see the module docstring).

    `measure(selected)` returns a timer for the model with `selected` applied (an empty selection: without the
    plan); each call of a timer times one block and returns its median in ms. Runners are built once per selection.
    While the selection loses, one entry is dropped: with at most `leave_one_out_limit` entries, the one whose removal
    leaves the fastest model (each removal timed); beyond it, the one with the smallest `saving(entry)` (the
    per-call estimate). Every trial is a row of the result; dropped entries carry the comparison that dropped them.
    """
    if blocks < 1:
        raise ValueError(f"blocks must be >= 1, got {blocks}")
    baseline = measure([])
    label_of = lambda selection: tuple(getattr(e, "function", str(e)) for e in selection)  # noqa: E731

    def compare(selection: Sequence[Any]) -> PairedComparison:
        planned = measure(selection)
        base_ms, plan_ms = [], []
        for block in range(blocks):
            progress("end-to-end check: %s, block %d/%d", ", ".join(label_of(selection)), block + 1, blocks)
            before = baseline()
            with_plan = planned()
            after = baseline()
            base_ms.append(min(before, after))
            plan_ms.append(with_plan)
        return PairedComparison(tuple(base_ms), tuple(plan_ms))

    trials: list[tuple[str, tuple[str, ...], PairedComparison, str]] = []
    dropped: list[tuple[Any, str]] = []
    current = list(entries)
    comparison = compare(current)
    label = "plan"
    while current:
        if comparison.faster(alpha, min_gain):
            trials.append((label, label_of(current), comparison, "kept: faster"))
            break
        trials.append((label, label_of(current), comparison, "loses: dropping an entry"))
        if len(current) == 1:
            dropped.append((current[0], f"the model is not faster with it: {comparison.describe()}"))
            current = []
            break
        if len(current) <= leave_one_out_limit:
            options = [(entry, compare([e for e in current if e is not entry])) for entry in current]
            entry, comparison = max(options, key=lambda option: option[1].speedup)
            for other, result in options:
                if other is not entry:
                    trials.append((f"- {getattr(other, 'function', other)}",
                                   label_of([e for e in current if e is not other]), result, "not chosen"))
        else:
            entry = min(current, key=saving or (lambda e: 0.0))
            comparison = compare([e for e in current if e is not entry])
        dropped.append((entry, f"the plan did not win with it; without it the plan is {comparison.describe()}"))
        current = [e for e in current if e is not entry]
        label = f"- {getattr(entry, 'function', entry)}"
    return PlanCheck(tuple(current), tuple(dropped), tuple(trials), execution)


@dataclass(frozen=True)
class VariantResult:
    """One row of the report: how a variant ran, its timing and its correctness against eager."""

    variant: str
    execution: Execution
    with_plan: bool
    result: BenchmarkResult | None = None
    max_abs_error: float | None = None
    correct: bool | None = None
    note: str = ""
    block_medians_ms: tuple[float, ...] = ()
    # Module entries of the plan this variant's runs never served (every call fell back to the original forward),
    # each "function: why" (`KernelProviderRuntime.unserved`): a saving the per-call timings promised that is not here.
    unserved: tuple[str, ...] = ()


@dataclass(frozen=True)
class EndToEndReport:
    """Every variant of `compare_end_to_end`; `frame()` is the printable table."""

    rows: tuple[VariantResult, ...] = field(default_factory=tuple)
    blocks: int = 0
    profiles: Mapping[tuple[Execution, bool], KernelProfile] = field(default_factory=dict)

    def kernel_diff(self, execution: Execution | str) -> KernelDiff | None:
        """Where the time went in `execution`: the profile of the model with the plan against without it (None
        when `compare_end_to_end` did not profile, or a variant failed)."""
        execution = parse_execution(execution)
        base, planned = self.profiles.get((execution, False)), self.profiles.get((execution, True))
        if base is None or planned is None:
            return None
        return KernelDiff(execution.value, base, planned)

    def kernel_summary(self) -> pd.DataFrame:
        """Device ms per pass without and with the plan in each profiled mode, and what the plan saved and added."""
        records = []
        for execution in Execution:
            diff = self.kernel_diff(execution)
            if diff is not None:
                records.append({"execution": execution.value, **diff.summary()})
        return pd.DataFrame(records, columns=["execution", "device_ms_without", "device_ms_with", "saved_ms",
                                              "added_ms"])

    def get(self, execution: Execution | str, with_plan: bool) -> VariantResult | None:
        execution = parse_execution(execution)
        for row in self.rows:
            if row.execution is execution and row.with_plan == with_plan:
                return row
        return None

    def median_ms(self, row: VariantResult) -> float | None:
        return statistics.median(row.block_medians_ms) if row.block_medians_ms else None

    def paired(self, execution: Execution | str, over: Execution | str | None = None) -> PairedComparison | None:
        """The plan variant of `execution` against `over` (default: the same mode without the plan), block by block
        (each block timed both, one after the other): the statistic `check_plan` decides with."""
        planned = self.get(execution, True)
        base = self.get(over if over is not None else execution, False)
        if planned is None or base is None or not planned.block_medians_ms:
            return None
        if len(planned.block_medians_ms) != len(base.block_medians_ms):
            return None
        return PairedComparison(base.block_medians_ms, planned.block_medians_ms)

    def speedup(self, execution: Execution | str, over: Execution | str | None = None) -> float | None:
        """Plan variant of `execution` vs `over` (default: the same mode without the plan): the median of the
        per-block ratios."""
        paired = self.paired(execution, over)
        return paired.speedup if paired is not None else None

    def frame(self) -> pd.DataFrame:
        eager = self.get(Execution.EAGER, False)
        eager_ms = self.median_ms(eager) if eager is not None else None
        records = []
        for row in self.rows:
            median = self.median_ms(row)
            same = self.paired(row.execution) if row.with_plan else None
            records.append({
                "variant": row.variant,
                "execution": row.execution.value,
                "plan": row.with_plan,
                "median_ms": median,
                "q25_ms": row.result.q25_ms if row.result is not None else None,
                "q75_ms": row.result.q75_ms if row.result is not None else None,
                "runs": row.result.runs if row.result is not None else 0,
                "speedup_vs_eager": eager_ms / median if eager_ms and median else None,
                "speedup_vs_same_mode": same.speedup if same is not None else None,
                "blocks_won": f"{same.wins}/{same.blocks}" if same is not None else None,
                "max_abs_error": row.max_abs_error,
                "correct": row.correct,
                "note": row.note,
            })
        return pd.DataFrame(records, columns=REPORT_COLUMNS)


def _captured(run: ModelRunner, device: torch.device) -> tuple[torch.cuda.CUDAGraph, Any]:
    """One pass of `run` captured in a CUDA graph, as a CUDA-graph deployment captures it, and its output buffers."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        run()  # warm-up outside capture (compilation, autotuning, workspace allocation)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = run()
    return graph, outputs


def _graph_outputs(run: ModelRunner, device: torch.device) -> Any:
    """The outputs of one replay of `run` captured in a CUDA graph (what a CUDA-graph deployment computes)."""
    graph, outputs = _captured(run, device)
    graph.replay()
    torch.cuda.synchronize(device)
    return [clone_value(o) for o in outputs]


def _profiles(runners: dict[tuple[Execution, bool], ModelRunner], device: torch.device, passes: int,
              notes: dict[tuple[Execution, bool], str]) -> dict[tuple[Execution, bool], KernelProfile]:
    """A kernel profile of every variant (`forge.profiler.kernels`); eager first, so the other modes can name the
    functions of their kernels from it."""
    found: dict[tuple[Execution, bool], KernelProfile] = {}
    order = sorted(runners, key=lambda key: list(Execution).index(key[0]))
    with torch.no_grad():
        for key in order:
            execution, with_plan = key
            run = runners[key]
            progress("end-to-end: profiling %s%s", execution.value, " + plan" if with_plan else "")
            eager = found.get((Execution.EAGER, with_plan))
            names = eager.function_of() if eager is not None else None
            try:
                if execution is Execution.CUDA_GRAPHS:
                    graph, _ = _captured(run, device)
                    found[key] = profile_kernels(graph.replay, device=device, passes=passes, label=False,
                                                 unlabelled_as=GRAPH, function_of=names)
                elif execution is Execution.COMPILE:
                    found[key] = profile_kernels(run, device=device, passes=passes, label=False,
                                                 unlabelled_as=COMPILED, function_of=names)
                else:
                    found[key] = profile_kernels(run, device=device, passes=passes)
            except Exception as exc:  # noqa: BLE001 - reported in the table
                logger.warning("profiling %s failed: %s", key, exc, exc_info=True)
                notes[key] = (notes.get(key, "") + f" profile failed: {type(exc).__name__}: {exc}").strip()
    return found


def _max_abs_error(outputs: Any, expected: Any) -> float:
    worst = 0.0
    got = list(iter_tensors(outputs))
    want = list(iter_tensors(expected))
    if len(got) != len(want):
        return math.inf
    for a, b in zip(got, want, strict=True):
        if a.shape != b.shape:
            return math.inf
        if a.numel():
            diff = (a.detach().double() - b.detach().double()).abs()
            diff = torch.where(torch.isnan(a.double()) & torch.isnan(b.double()), torch.zeros_like(diff), diff)
            worst = max(worst, float(diff.max()))
    return worst


def _allowed_error(expected: Any) -> float:
    """A loose whole-model bound: kernels differ from eager by rounding, which compounds through layers."""
    scale = max((float(t.detach().double().abs().max()) for t in iter_tensors(expected) if t.numel()), default=1.0)
    dtypes = {t.dtype for t in iter_tensors(expected)}
    relative = 5e-2 if dtypes & {torch.float16, torch.bfloat16} else 1e-3
    return relative * max(scale, 1e-6)


def _timed_blocks(
    runners: dict[tuple[Execution, bool], ModelRunner],
    medians: dict[tuple[Execution, bool], list[float]],
    times: dict[tuple[Execution, bool], list[float]],
    notes: dict[tuple[Execution, bool], str],
    device: torch.device,
    blocks: int,
    rounds: int,
    min_run_time_s: float,
) -> None:
    """Every runner once per block, the order reversed every other block (so a drift over the run favours no
    variant); a runner that fails leaves with a note."""
    active = dict(runners)
    with torch.no_grad():
        for block in range(blocks):
            progress("end-to-end: block %d/%d", block + 1, blocks)
            order = list(active.items())
            for key, run in order[::-1] if block % 2 else order:
                try:
                    result = time_model(run, execution=key[0], device=device, rounds=rounds,
                                        min_run_time_s=min_run_time_s)
                except Exception as exc:  # noqa: BLE001 - reported in the table
                    logger.warning("end-to-end timing of %s failed: %s", key, exc, exc_info=True)
                    notes[key] = f"timing failed: {type(exc).__name__}: {exc}"
                    active.pop(key)
                    medians[key].clear()
                    times[key].clear()
                    continue
                medians[key].append(result.median_ms)
                times[key].extend(result.times_ms)


def compare_end_to_end(
    model: nn.Module,
    samples: Sequence[Sample],
    plan: KernelOptimizationPlan,
    *,
    executions: Sequence[Execution | str] | None = None,
    blocks: int = 6,
    rounds: int = 10,
    min_run_time_s: float = 0.05,
    compile_options: Mapping[str, Any] | None = None,
    profile: bool = False,
    profile_passes: int = 3,
) -> EndToEndReport:
    """Time `model` over `samples` in every execution mode with and without `plan` (see the module docstring).

    `profile`: also profile every variant's kernels after timing (`EndToEndReport.kernel_diff`: where the time went).

    `executions`: default eager, CUDA graphs (CUDA only) and compile. A variant that fails to build or run is a row
    with a note instead of a traceback; correctness compares each variant's outputs with eager's (loose whole-model
    bound: `max_abs_error` shows the number).
    """
    if blocks < 1:
        raise ValueError(f"blocks must be >= 1, got {blocks}")
    device = samples_device(samples)
    wanted = [parse_execution(e) for e in (executions or list(Execution))]
    with torch.no_grad():
        expected = [model(*s.args, **s.kwargs) for s in samples]
    tolerance = _allowed_error(expected)
    runners: dict[tuple[Execution, bool], ModelRunner] = {}
    notes: dict[tuple[Execution, bool], str] = {}
    errors: dict[tuple[Execution, bool], float] = {}
    labels = {Execution.EAGER: "eager", Execution.CUDA_GRAPHS: "CUDA graphs", Execution.COMPILE: "torch.compile"}
    for execution in wanted:
        for with_plan in (False, True):
            key = (execution, with_plan)
            if execution is Execution.CUDA_GRAPHS and device.type != "cuda":
                notes[key] = "needs CUDA"
                continue
            if with_plan and not len(plan):
                notes[key] = "empty plan"
                continue
            progress("end-to-end: preparing %s%s", labels[execution], " + plan" if with_plan else "")
            run: ModelRunner | None = None
            try:
                run = ModelRunner(model, samples, execution=execution, plan=plan if with_plan else None,
                                  compile_options=compile_options)
                if run.runtime is not None:  # every mode on purpose; the note says which one the plan is for
                    run.runtime.silence_mode_warnings()
                with torch.no_grad():
                    outputs = _graph_outputs(run, device) if execution is Execution.CUDA_GRAPHS else run(clone=True)
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
            except Exception as exc:  # noqa: BLE001 - a variant that cannot run is reported, not raised
                logger.warning("end-to-end variant %s failed: %s", (execution.value, with_plan), exc, exc_info=True)
                notes[key] = f"failed: {type(exc).__name__}: {exc}"
                if run is not None:
                    run.close()
                continue
            errors[key] = _max_abs_error(outputs, expected)
            runners[key] = run
    medians: dict[tuple[Execution, bool], list[float]] = {key: [] for key in runners}
    times: dict[tuple[Execution, bool], list[float]] = {key: [] for key in runners}
    profiles: dict[tuple[Execution, bool], KernelProfile] = {}
    try:
        _timed_blocks(runners, medians, times, notes, device, blocks, rounds, min_run_time_s)
        if profile and len(plan):
            profiles = _profiles({k: r for k, r in runners.items() if medians.get(k)}, device, profile_passes, notes)
    finally:
        unserved = {key: tuple(f"{entry.function}: {why}" for entry, why in run.runtime.unserved())
                    for key, run in runners.items() if run.runtime is not None}
        for run in runners.values():
            run.close()
    rows = []
    for execution in wanted:
        for with_plan in (False, True):
            key = (execution, with_plan)
            label = labels[execution] + (" + plan" if with_plan else "")
            result = summarize(times[key], str(device)) if times.get(key) else None
            error = errors.get(key)
            note = notes.get(key, "")
            if with_plan and len(plan) and plan.execution is not execution and not note:
                note = f"plan made for {plan.execution.value}"
            missed = unserved.get(key, ())
            if missed:
                note = "; ".join(filter(None, [note, f"{len(missed)} module entr{'y' if len(missed) == 1 else 'ies'} "
                                                     f"never served (first: {missed[0]})"]))
            rows.append(VariantResult(
                variant=label, execution=execution, with_plan=with_plan, result=result, max_abs_error=error,
                correct=None if error is None else bool(error <= tolerance), note=note,
                block_medians_ms=tuple(medians.get(key, ())), unserved=missed,
            ))
    return EndToEndReport(rows=tuple(rows), blocks=blocks, profiles=profiles)
