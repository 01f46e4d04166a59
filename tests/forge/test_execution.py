"""Execution modes and timing modes: parsing, benchmark clocks, plans that record their mode, the end-to-end report."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from forge.checking import BenchmarkResult, KernelUtils, benchmark
from forge.end_to_end import ModelRunner, compare_end_to_end, time_model
from forge.execution import Execution, TimingMode, parse_execution, parse_timing_mode
from forge.optimizer import KernelOptimizer
from forge.plan import KernelOptimizationPlan, PlanEntry, PlanLoadError
from forge.provider import KernelGenerator
from forge.samples import Sample
from tests.forge.providers_for_tests import DoublingReluProvider, FastGeluProvider, WrongGeluProvider
from tests.forge.test_optimizer import FAST_UTILS, GeluNet, slow_baseline  # noqa: F401 - fixture

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


class ReluNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.proj(x))


def _relu_plan(model: nn.Module, data: list[Sample], provider=None) -> KernelOptimizationPlan:
    provider = provider or DoublingReluProvider()
    with torch.no_grad():
        hidden = [model.proj(*s.args) for s in data]
    provider.prepare([Sample((h,), {}) for h in hidden])
    entry = PlanEntry(provider=provider, signatures=tuple(Sample((h,), {}) for h in hidden))
    return KernelOptimizationPlan(entries=(entry,), execution="eager")


def test_parse_execution_and_timing_mode() -> None:
    assert parse_execution("cuda-graphs") is Execution.CUDA_GRAPHS
    assert parse_execution(Execution.COMPILE) is Execution.COMPILE
    assert Execution.EAGER.timing_mode is TimingMode.EAGER
    assert Execution.CUDA_GRAPHS.timing_mode is TimingMode.DEVICE
    assert Execution.COMPILE.timing_mode is TimingMode.DEVICE
    assert parse_timing_mode("DEVICE") is TimingMode.DEVICE
    with pytest.raises(ValueError, match="unknown execution mode 'graphs'; use one of 'eager', 'cuda_graphs'"):
        parse_execution("graphs")
    with pytest.raises(ValueError, match="unknown timing mode"):
        KernelUtils(timing="wall")


def test_benchmark_records_its_mode_and_refuses_mixed_comparisons() -> None:
    samples = [Sample((torch.randn(64),), {})]
    eager = benchmark(F.silu, samples, rounds=5, min_run_time_s=0, mode="eager")
    device = KernelUtils(timing="device", rounds=5, min_run_time_s=0, warmup=1).benchmark(F.silu, samples)
    assert (eager.mode, device.mode) == ("eager", "device")
    assert BenchmarkResult.from_dict(device.to_dict()).mode == "device"
    assert BenchmarkResult.from_dict({k: v for k, v in eager.to_dict().items() if k != "mode"}).mode == "eager"
    with pytest.raises(ValueError, match="cannot compare device timing with eager timing"):
        device.speedup_over(eager)


def test_plan_records_execution_and_rejects_an_unknown_one(tmp_path) -> None:
    model, data = ReluNet(), [Sample((torch.randn(4, 16),), {})]
    plan = _relu_plan(model, data)
    compiled_plan = KernelOptimizationPlan(entries=plan.entries, execution="compile")
    path = compiled_plan.save(tmp_path / "plan.json")
    assert KernelOptimizationPlan.load(path).execution is Execution.COMPILE
    raw = json.loads(path.read_text())
    raw.pop("execution")
    assert KernelOptimizationPlan.from_dict(raw).execution is Execution.EAGER  # plans written before the field
    raw["execution"] = "warp-speed"
    with pytest.raises(PlanLoadError, match="execution.*unknown execution mode 'warp-speed'"):
        KernelOptimizationPlan.from_dict(raw)


class _RecordingGenerator(KernelGenerator):
    def __init__(self) -> None:
        self.executions: list[Execution] = []

    def supports_functions(self) -> list[str]:
        return ["gelu"]

    def prepare(self, function, samples) -> bool:
        return False  # declines: only the hook matters here

    def submit(self, function, samples):  # pragma: no cover - never reached
        raise AssertionError("declined generators are not submitted")

    def use_execution(self, execution: Execution) -> None:
        self.executions.append(execution)

    def use_clock(self, timing: TimingMode) -> None:
        self.executions.append(timing)


def test_make_plan_selects_on_the_execution_clock_and_tells_generators(slow_baseline) -> None:  # noqa: F811
    generator = _RecordingGenerator()
    optimizer = KernelOptimizer(kernel_providers=[FastGeluProvider(), WrongGeluProvider()],
                                kernel_generators=[generator], kernel_utils=FAST_UTILS,
                                generator_min_time_share_percent=0.0)
    data = [Sample((torch.randn(8, 16),), {}) for _ in range(2)]
    plan = optimizer.make_plan(GeluNet(), data, execution="cuda_graphs")
    assert plan.execution is Execution.CUDA_GRAPHS
    assert generator.executions == [Execution.CUDA_GRAPHS, TimingMode.DEVICE]  # the mode, then the clock
    assert plan.functions == ["gelu"]
    assert set(optimizer.end_to_end["execution"]) == {"cuda_graphs"}
    with pytest.raises(ValueError, match="unknown execution mode"):
        optimizer.make_plan(GeluNet(), data, execution="fast")


class _RecordingModuleSource:
    """A module source that takes the hooks (as `agent.modules.LLMModuleSource` passes them to its generator)."""

    def __init__(self) -> None:
        self.told: list[object] = []

    def __call__(self, target_class: str):  # pragma: no cover - the net has no module target
        raise AssertionError("no module target here")

    def use_execution(self, execution: Execution) -> None:
        self.told.append(execution)

    def use_clock(self, timing: TimingMode) -> None:
        self.told.append(timing)


def test_a_generator_that_writes_only_modules_is_told_the_mode_and_clock_too() -> None:
    """Told once per plan, before any generation, whether or not an F call is generated (before, only a generator
    that was submitted an F call heard of the mode, and module conversations timed on eager under CUDA graphs)."""
    source = _RecordingModuleSource()
    optimizer = KernelOptimizer(kernel_providers=[FastGeluProvider()], module_sources=[source],
                                kernel_utils=FAST_UTILS, end_to_end_check=False, module_min_time_share_percent=100.0)
    optimizer.make_plan(GeluNet(), [Sample((torch.randn(8, 16),), {})], execution="compile")
    assert source.told == [Execution.COMPILE, TimingMode.DEVICE]


def test_model_runner_applies_the_plan_only_inside_its_calls() -> None:
    model, data = ReluNet(), [Sample((torch.randn(4, 16),), {})]
    provider = DoublingReluProvider()
    plan = _relu_plan(model, data, provider)
    runner = ModelRunner(model, data, execution="eager", plan=plan)
    with torch.no_grad():
        runner()
        assert provider.calls == 1
        model(*data[0].args)  # outside the runner: stock PyTorch
        assert provider.calls == 1
    runner.close()
    assert F.relu is torch.nn.functional.relu and F.relu.__module__ == "torch.nn.functional"


def test_compare_end_to_end_reports_every_variant_with_correctness() -> None:
    model, data = ReluNet(), [Sample((torch.randn(4, 16),), {}) for _ in range(2)]
    plan = _relu_plan(model, data)
    report = compare_end_to_end(model, data, plan, blocks=2, rounds=3, min_run_time_s=0,
                                compile_options={"backend": "aot_eager"})
    frame = report.frame()
    assert list(frame["variant"]) == ["eager", "eager + plan", "CUDA graphs", "CUDA graphs + plan", "torch.compile",
                                      "torch.compile + plan"]
    rows = frame.set_index("variant")
    for name in ("eager", "eager + plan", "torch.compile", "torch.compile + plan"):
        assert rows.loc[name, "correct"] == True, rows.loc[name, "note"]  # noqa: E712 - numpy bool
        assert rows.loc[name, "runs"] >= 6
        assert rows.loc[name, "median_ms"] > 0
    assert rows.loc["CUDA graphs", "note"] == "needs CUDA"
    assert report.speedup("eager") is not None and report.speedup("compile") is not None


def test_compare_end_to_end_flags_a_wrong_plan() -> None:
    """A plan whose kernel is wrong shows as incorrect against eager (the report checks outputs, not only time)."""

    class WrongRelu(DoublingReluProvider, type_name="test_wrong_relu_e2e"):
        def _call(self, x, inplace=False):
            return torch.abs(x)

    model, data = ReluNet(), [Sample((torch.randn(4, 16),), {})]
    plan = _relu_plan(model, data, WrongRelu())
    report = compare_end_to_end(model, data, plan, executions=["eager"], blocks=1, rounds=2, min_run_time_s=0)
    row = report.get("eager", True)
    assert row.correct is False and row.max_abs_error > 0.01


@cuda
def test_device_mode_replays_a_cuda_graph_and_refuses_uncapturable_callables() -> None:
    from forge.checking.benchmarking import NotCapturableError

    x = torch.randn(1 << 20, device="cuda")
    result = benchmark(F.silu, [Sample((x,), {})], mode="device", rounds=5)
    assert result.mode == "device" and result.median_ms > 0

    def syncs(t):
        return t * float(t.sum())  # reads a device value on the host: not capturable

    stream = torch.cuda.current_stream()
    with pytest.raises(NotCapturableError):
        benchmark(syncs, [Sample((x,), {})], mode="device", rounds=5)
    # The process stays usable: same current stream, random ops work, a capturable callable still times.
    assert torch.cuda.current_stream() == stream
    assert torch.randn(4, device="cuda").shape == (4,)
    assert benchmark(F.silu, [Sample((x,), {})], mode="device", rounds=3).runs >= 3


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_a_whole_model_timing_runs_on_the_device_it_is_given() -> None:
    """A whole model is timed as `fn()` with no tensor arguments: its device comes from the caller. Deriving it from
    the (empty) samples timed CUDA models with the CPU timer: launch time, never synchronised, never a graph."""
    with pytest.raises(ValueError, match="cannot time on cuda: CUDA is not available"):
        benchmark(lambda: None, [Sample((), {})], device="cuda", rounds=1, min_run_time_s=0)


@cuda
def test_whole_model_timing_counts_the_device_work_in_every_mode() -> None:
    class Sleeper(nn.Module):
        def forward(self, x):
            torch.cuda._sleep(2_000_000)  # ~1 ms of device time, microseconds of host time
            return x + 1

    model, data = Sleeper(), [Sample((torch.randn(8, device="cuda"),), {})]
    for execution in ("eager", "cuda_graphs"):
        runner = ModelRunner(model, data, execution=execution)
        result = time_model(runner, execution=execution, device=torch.device("cuda"), rounds=5, min_run_time_s=0)
        assert result.median_ms > 0.3, (execution, result)
        assert result.mode == ("device" if execution == "cuda_graphs" else "eager")
