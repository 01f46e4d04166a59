"""Where the time went: the kernel profile of a model with and without a plan (`forge.profiler.kernels`), on CPU
(ATen ops stand for kernels), through the real runtime and `compare_end_to_end`."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from forge.end_to_end import ModelRunner, compare_end_to_end
from forge.functional import original_function
from forge.profiler.kernels import OUTSIDE, labelled_functions, profile_kernels
from forge.samples import Sample
from tests.forge.test_execution import ReluNet, _relu_plan


class GlueNet(ReluNet):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.proj(x)) * 2.0 + x  # the multiply and the add are glue: no F call


def test_kernels_are_tied_to_the_call_that_launched_them_and_to_the_plan():
    model, data = GlueNet(), [Sample((torch.randn(4, 16),), {})]
    plan = _relu_plan(model, data)
    base = ModelRunner(model, data)
    planned = ModelRunner(model, data, plan=plan)
    try:
        without = profile_kernels(base, device=torch.device("cpu"), passes=2)
        with_plan = profile_kernels(planned, device=torch.device("cpu"), passes=2)
    finally:
        planned.close()
    rows = without.frame.set_index(["kernel", "function"])
    assert rows.loc[("aten::relu", "relu"), "calls"] == 1  # per pass
    assert ("aten::addmm", "linear") in rows.index
    assert {("aten::mul", OUTSIDE), ("aten::add", OUTSIDE)} <= set(rows.index)
    served = with_plan.frame[with_plan.frame["by_plan"]]
    assert set(served["function"]) == {"relu"} and "aten::clamp_min" in set(served["kernel"])
    assert "aten::relu" not in set(with_plan.frame["kernel"])
    assert plan.entries[0].provider.calls == 2


def test_the_labels_are_removed_after_the_profile_also_on_error():
    try:
        with labelled_functions():
            assert F.relu is not original_function("relu")
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert F.relu is original_function("relu")


def test_compare_end_to_end_says_where_the_time_went():
    model, data = GlueNet(), [Sample((torch.randn(4, 16),), {})]
    plan = _relu_plan(model, data)
    report = compare_end_to_end(model, data, plan, executions=["eager"], blocks=1, rounds=2, min_run_time_s=0,
                                profile=True, profile_passes=2)
    diff = report.kernel_diff("eager")
    by_function = diff.by_function().set_index("function")
    assert by_function.loc["relu", "device_ms_without"] > 0 and by_function.loc["relu", "device_ms_with"] > 0
    kernels = diff.by_kernel(None)
    relu = kernels[kernels["kernel"] == "aten::relu"].iloc[0]
    assert relu["calls_without"] == 1 and relu["calls_with"] == 0 and relu["delta_ms"] < 0
    summary = report.kernel_summary().set_index("execution")
    assert summary.loc["eager", "device_ms_without"] > 0 and summary.loc["eager", "device_ms_with"] > 0
    changed = diff.by_function()["delta_ms"]  # on CPU the relu swap can go either way; the totals add up
    assert summary.loc["eager", "saved_ms"] == pytest.approx(-changed[changed < 0].sum())
    assert report.kernel_diff("compile") is None  # not run


def test_no_profile_unless_asked():
    model, data = nn.Sequential(nn.Linear(4, 4)), [Sample((torch.randn(2, 4),), {})]
    plan = _relu_plan(ReluNet(), [Sample((torch.randn(2, 16),), {})])
    report = compare_end_to_end(model, data, plan, executions=["eager"], blocks=1, rounds=1, min_run_time_s=0)
    assert report.kernel_summary().empty
