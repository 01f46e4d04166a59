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

`KernelOptimizer.make_plan` uses `time_model` (one variant) for its end-to-end check in the plan's execution mode.
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
from forge.progress import progress
from forge.samples import Sample, clone_value, iter_tensors

if TYPE_CHECKING:
    from forge.plan import KernelOptimizationPlan

__all__ = ["EndToEndReport", "ModelRunner", "VariantResult", "compare_end_to_end", "time_model"]

logger = logging.getLogger(__name__)

REPORT_COLUMNS = ["variant", "execution", "plan", "median_ms", "q25_ms", "q75_ms", "runs", "speedup_vs_eager",
                  "speedup_vs_same_mode", "max_abs_error", "correct", "note"]


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
                     mode=mode, flush_l2=device.type == "cuda")


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


@dataclass(frozen=True)
class EndToEndReport:
    """Every variant of `compare_end_to_end`; `frame()` is the printable table."""

    rows: tuple[VariantResult, ...] = field(default_factory=tuple)
    blocks: int = 0

    def get(self, execution: Execution | str, with_plan: bool) -> VariantResult | None:
        execution = parse_execution(execution)
        for row in self.rows:
            if row.execution is execution and row.with_plan == with_plan:
                return row
        return None

    def median_ms(self, row: VariantResult) -> float | None:
        return statistics.median(row.block_medians_ms) if row.block_medians_ms else None

    def speedup(self, execution: Execution | str, over: Execution | str | None = None) -> float | None:
        """Plan variant of `execution` vs `over` (default: the same mode without the plan)."""
        planned = self.get(execution, True)
        base = self.get(over if over is not None else execution, False)
        if planned is None or base is None:
            return None
        a, b = self.median_ms(planned), self.median_ms(base)
        return b / a if a and b else None

    def frame(self) -> pd.DataFrame:
        eager = self.get(Execution.EAGER, False)
        eager_ms = self.median_ms(eager) if eager is not None else None
        records = []
        for row in self.rows:
            median = self.median_ms(row)
            same = self.get(row.execution, False)
            same_ms = self.median_ms(same) if same is not None and row.with_plan else None
            records.append({
                "variant": row.variant,
                "execution": row.execution.value,
                "plan": row.with_plan,
                "median_ms": median,
                "q25_ms": row.result.q25_ms if row.result is not None else None,
                "q75_ms": row.result.q75_ms if row.result is not None else None,
                "runs": row.result.runs if row.result is not None else 0,
                "speedup_vs_eager": eager_ms / median if eager_ms and median else None,
                "speedup_vs_same_mode": same_ms / median if same_ms and median else None,
                "max_abs_error": row.max_abs_error,
                "correct": row.correct,
                "note": row.note,
            })
        return pd.DataFrame(records, columns=REPORT_COLUMNS)


def _graph_outputs(run: ModelRunner, device: torch.device) -> Any:
    """The outputs of one replay of `run` captured in a CUDA graph (what a CUDA-graph deployment computes)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        run()  # warm-up outside capture (compilation, autotuning, workspace allocation)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = run()
    graph.replay()
    torch.cuda.synchronize(device)
    return [clone_value(o) for o in outputs]


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
    """Every runner once per block, in the same order each block; a runner that fails leaves with a note."""
    active = dict(runners)
    with torch.no_grad():
        for block in range(blocks):
            progress("end-to-end: block %d/%d", block + 1, blocks)
            for key, run in list(active.items()):
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
) -> EndToEndReport:
    """Time `model` over `samples` in every execution mode with and without `plan` (see the module docstring).

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
    try:
        _timed_blocks(runners, medians, times, notes, device, blocks, rounds, min_run_time_s)
    finally:
        for run in runners.values():
            run.close()
    rows = []
    for execution in wanted:
        for with_plan in (False, True):
            key = (execution, with_plan)
            label = labels[execution] + (" + plan" if with_plan else "")
            result = summarize(times[key], str(device)) if times.get(key) else None
            error = errors.get(key)
            rows.append(VariantResult(
                variant=label, execution=execution, with_plan=with_plan, result=result, max_abs_error=error,
                correct=None if error is None else bool(error <= tolerance), note=notes.get(key, ""),
                block_medians_ms=tuple(medians.get(key, ())),
            ))
    return EndToEndReport(rows=tuple(rows), blocks=blocks)
