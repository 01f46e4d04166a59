"""Plans for the way a model runs: the selection clock (`forge.execution.clock_for`), the compile-mode baseline
(what Inductor makes of the call), and the warning when a plan runs in a mode it was not made for."""

from __future__ import annotations

import warnings

import pytest
import torch

from forge.execution import DEVICE_BOUND_SHARE, Execution, TimingMode, clock_for
from forge.optimizer import KernelOptimizer
from forge.plan import KernelOptimizationPlan
from forge.runtime import PlanModeWarning
from forge.samples import Sample
from tests.forge.providers_for_tests import FastGeluProvider
from tests.forge.test_execution import ReluNet, _relu_plan
from tests.forge.test_optimizer import FAST_UTILS, GeluNet


def test_the_clock_follows_what_bounds_the_model():
    assert clock_for(Execution.CUDA_GRAPHS, 3.0, 7.0).timing is TimingMode.DEVICE
    assert clock_for(Execution.COMPILE, None, None).timing is TimingMode.DEVICE
    device_bound = clock_for(Execution.EAGER, 11.8, 13.0)
    assert device_bound.timing is TimingMode.DEVICE and "device-bound" in device_bound.reason
    host_bound = clock_for(Execution.EAGER, 11.9, 31.8)
    assert host_bound.timing is TimingMode.EAGER and "host-bound" in host_bound.reason
    assert clock_for(Execution.EAGER, DEVICE_BOUND_SHARE * 10, 10.0).timing is TimingMode.DEVICE
    assert clock_for(Execution.EAGER, 1.0, None).timing is TimingMode.EAGER


def test_in_eager_the_clock_is_the_devices_when_graphed_blocks_hold_the_kernel_time():
    # The Llama prefill: host-bound eager (11.7 ms of kernels in a 26.7 ms forward), 86% of its kernels in its layers.
    graphed = clock_for(Execution.EAGER, 11.7, 26.7, graphed_share=0.86)
    assert graphed.timing is TimingMode.DEVICE and "replayed from CUDA graphs" in graphed.reason
    assert clock_for(Execution.EAGER, 11.7, 26.7, graphed_share=DEVICE_BOUND_SHARE * 0.9).timing is TimingMode.EAGER


def test_make_plan_records_its_clock():
    optimizer = KernelOptimizer(kernel_providers=[FastGeluProvider()], kernel_utils=FAST_UTILS,
                                end_to_end_check=False)
    optimizer.make_plan(GeluNet(), [Sample((torch.randn(4, 16),), {})])
    assert optimizer.clock.timing is TimingMode.EAGER and "CPU" in optimizer.clock.reason


def test_under_compile_a_candidate_must_beat_inductor():
    optimizer = KernelOptimizer(kernel_providers=[FastGeluProvider()], kernel_utils=FAST_UTILS,
                                end_to_end_check=False)
    optimizer.make_plan(GeluNet(), [Sample((torch.randn(4, 16),), {})], execution="compile")
    baseline = optimizer.report[optimizer.report["status"] == "baseline"]
    assert list(baseline["candidate"]) == ["PyTorch (Inductor)"]


def _relu_plan_for(execution: str) -> tuple[ReluNet, list[Sample], KernelOptimizationPlan]:
    model, data = ReluNet(), [Sample((torch.randn(4, 16),), {})]
    plan = _relu_plan(model, data)
    return model, data, KernelOptimizationPlan(entries=plan.entries, execution=execution)


def test_a_plan_declared_for_another_mode_warns():
    model, _, plan = _relu_plan_for("cuda_graphs")
    with pytest.warns(PlanModeWarning, match="made for cuda_graphs runs under eager"):
        plan.runtime(model, execution="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlanModeWarning)
        plan.runtime(model, execution="cuda_graphs")


def test_an_eager_plan_inside_torch_compile_warns_once():
    model, data, plan = _relu_plan_for("eager")
    with plan.apply(model) as runtime:
        compiled = torch.compile(model, backend="aot_eager")
        with pytest.warns(PlanModeWarning, match="made for eager runs under compile"):
            compiled(*data[0].args)
        with warnings.catch_warnings():
            warnings.simplefilter("error", PlanModeWarning)
            compiled(*data[0].args)  # once per mode
        assert runtime.stats["relu"].provider_calls >= 1


def test_a_compile_plan_inside_torch_compile_is_quiet():
    model, data, plan = _relu_plan_for("compile")
    with plan.apply(model), warnings.catch_warnings():
        warnings.simplefilter("error", PlanModeWarning)
        torch.compile(model, backend="aot_eager")(*data[0].args)
