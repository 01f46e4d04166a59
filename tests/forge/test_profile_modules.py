"""Kernel time by module class (`forge.profiler.modules`) on a model shaped like a Llama block, on CPU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from forge.optimizer import KernelOptimizer
from forge.profiler.modules import profile_modules
from forge.samples import Sample
from tests.forge.providers_for_tests import FastGeluProvider
from tests.forge.test_optimizer import FAST_UTILS


class RMSNorm(nn.Module):
    """No F call at all, like transformers' LlamaRMSNorm."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class Block(nn.Module):
    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.norm = RMSNorm(dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        return x + torch.nn.functional.gelu(self.proj(self.norm(x)))  # the residual add is glue


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(Block(), Block())

    def forward(self, x):
        return self.blocks(x)


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def test_time_goes_to_the_class_that_launched_it_inside_and_outside_f_calls():
    model, x = Net(), torch.randn(64, 32)
    model(x)
    profile = profile_modules(lambda: model(x), model, device=torch.device("cpu"), passes=2)
    rows = profile.frame.set_index("module_class")
    norm, block, linear = rows.loc[_name(RMSNorm)], rows.loc[_name(Block)], rows.loc[_name(nn.Linear)]
    assert norm["leaf"] and norm["instances"] == 2 and norm["calls"] == 2
    assert norm["self_ms"] > 0 and norm["in_f_ms"] == 0 and norm["outside_f_ms"] == norm["self_ms"]
    assert linear["in_f_ms"] == linear["self_ms"] > 0
    assert not block["leaf"] and block["in_f_ms"] > 0 and block["outside_f_ms"] > 0  # gelu inside, the add outside
    assert block["inclusive_ms"] >= block["self_ms"] + norm["self_ms"] + linear["self_ms"] - 1e-9
    assert abs(rows["self_ms"].sum() - profile.total_ms) < 1e-6
    assert not model.blocks[0].norm._forward_pre_hooks and not model.blocks[0].norm._forward_hooks


def test_make_plan_reports_the_hot_module_classes():
    optimizer = KernelOptimizer(kernel_providers=[FastGeluProvider()], kernel_utils=FAST_UTILS,
                                end_to_end_check=False)
    optimizer.make_plan(Net(), [Sample((torch.randn(64, 32),), {})])
    hot = optimizer.module_profile.hot(3)
    assert _name(RMSNorm) in set(optimizer.module_profile.frame["module_class"]) and len(hot) == 3


def test_the_reachable_share_is_the_f_calls_plus_the_glue_of_the_targeted_classes():
    model, x = Net(), torch.randn(64, 32)
    model(x)
    profile = profile_modules(lambda: model(x), model, device=torch.device("cpu"), passes=2)
    rows = profile.frame.set_index("module_class")
    in_f = 100.0 * rows["in_f_ms"].sum() / profile.total_ms
    untargeted = profile.reach([])
    assert untargeted.targets_pct == 0 and untargeted.reachable_pct == pytest.approx(in_f)
    assert [name for name, _ in untargeted.unreached][:1] == [rows["outside_f_ms"].idxmax()]  # largest glue first
    norms = profile.reach([_name(RMSNorm)])
    norm_glue = 100.0 * rows.loc[_name(RMSNorm), "outside_f_ms"] / profile.total_ms
    assert norms.reachable_pct == pytest.approx(in_f + norm_glue)
    assert _name(RMSNorm) not in dict(norms.unreached) and _name(Block) in dict(norms.unreached)
    everything = profile.reach([_name(RMSNorm), _name(Block), _name(Net)])
    assert everything.reachable_pct == pytest.approx(100.0) and not everything.unreached
    assert everything.describe().startswith("reachable: 100.0% of ")
    assert "not reached: " in norms.describe() and "Block" in norms.describe()
