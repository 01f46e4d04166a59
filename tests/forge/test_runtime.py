"""The runtime swaps functions only during forward, restores them always, and guards by signature."""

from __future__ import annotations

import timeit

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from forge.plan import KernelOptimizationPlan, PlanEntry
from forge.runtime import KernelProviderRuntime
from forge.samples import Sample
from tests.forge.providers_for_tests import DoublingReluProvider, FastGeluProvider


class ReluNet(nn.Module):
    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.fail = fail
        self.seen: list = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(F.relu)
        y = F.relu(x)
        if self.fail:
            raise RuntimeError("forward failed")
        return y


def _plan(provider, *samples: Sample) -> KernelOptimizationPlan:
    provider.prepare(list(samples))
    return KernelOptimizationPlan(entries=(PlanEntry(provider=provider, signatures=samples),))


def test_provider_used_only_inside_forward_and_restored() -> None:
    x = torch.randn(4, 8)
    provider = DoublingReluProvider()
    plan = _plan(provider, Sample((x,), {}))
    net = ReluNet()
    original = F.relu
    with plan.apply(net) as runtime:
        assert F.relu is original  # not patched outside forward
        out = net(x)
        assert F.relu is original
        assert runtime.is_active
    assert provider.calls == 1
    assert net.seen[-1] is not original and net.seen[-1].__name__ == "relu"
    assert torch.equal(out, torch.relu(x))
    assert not net._forward_pre_hooks and not net._forward_hooks
    net(x)
    assert provider.calls == 1  # plan no longer applied


def test_restored_after_forward_raises() -> None:
    x = torch.randn(4, 8)
    provider = DoublingReluProvider()
    plan = _plan(provider, Sample((x,), {}))
    net = ReluNet(fail=True)
    before = dict(vars(F))
    with plan.apply(net), pytest.raises(RuntimeError, match="forward failed"):
        net(x)
    assert provider.calls == 1
    after = dict(vars(F))
    assert before.keys() == after.keys()
    assert all(before[k] is after[k] for k in before)


def test_signature_guard_falls_back_on_unvalidated_signatures() -> None:
    x = torch.randn(4, 8)
    provider = DoublingReluProvider()
    plan = _plan(provider, Sample((x,), {}))
    net = ReluNet()
    with plan.apply(net) as runtime:
        net(torch.randn(4, 8))  # same signature, new values: provider
        net(torch.randn(5, 8))  # other shape: fallback
        net(torch.randn(4, 8, dtype=torch.float64))  # other dtype: fallback
        net(torch.randn(8, 4).t())  # other strides: fallback
    stats = runtime.stats["relu"]
    assert provider.calls == 1
    assert stats.provider_calls == 1 and stats.fallback_calls == 3


def test_guard_falls_back_when_grad_is_needed() -> None:
    x = torch.randn(4, 8)
    provider = DoublingReluProvider()
    plan = _plan(provider, Sample((x,), {}))
    net = ReluNet()
    runtime = KernelProviderRuntime(net, plan)
    runtime.activate()
    try:
        y = net(x.clone().requires_grad_())
        y.sum().backward()  # the original op has a backward; the provider would not be used here
    finally:
        runtime.deactivate()
    assert provider.calls == 0


def test_nested_and_reentrant_forwards_restore_lifo() -> None:
    x = torch.randn(4, 8)

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = ReluNet()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(F.relu(x))

    outer = Outer()
    outer_provider, inner_provider = DoublingReluProvider(), DoublingReluProvider()
    outer_plan = _plan(outer_provider, Sample((x,), {}))
    inner_plan = _plan(inner_provider, Sample((x,), {}))
    original = F.relu
    with outer_plan.apply(outer), inner_plan.apply(outer.inner):
        outer(x)
        assert F.relu is original
    assert outer_provider.calls == 1 and inner_provider.calls == 1
    assert F.relu is original


def test_deactivate_restores_unbalanced_patches() -> None:
    x = torch.randn(4, 8)
    plan = _plan(DoublingReluProvider(), Sample((x,), {}))
    net = ReluNet()
    runtime = KernelProviderRuntime(net, plan)
    runtime.activate()
    original = F.relu
    runtime._pre_hook(net, (x,))  # a forward that never reached its post hook
    assert F.relu is not original
    runtime.deactivate()
    assert F.relu is original and not runtime.is_active


def test_provider_error_at_runtime_falls_back() -> None:
    x = torch.randn(4, 8)

    class Broken(DoublingReluProvider, type_name="test_broken_relu"):
        def _call(self, x, inplace=False):
            raise RuntimeError("boom")

    plan = _plan(Broken(), Sample((x,), {}))
    net = ReluNet()
    with plan.apply(net) as runtime:
        out = net(x)
    assert torch.equal(out, torch.relu(x))
    assert runtime.stats["relu"].provider_errors == 1


def test_apply_runs_under_no_grad_and_restores_grad_mode() -> None:
    x = torch.randn(4, 8)
    plan = _plan(FastGeluProvider(), Sample((x,), {}))
    assert torch.is_grad_enabled()
    with plan.apply(nn.GELU()):
        assert not torch.is_grad_enabled()
    assert torch.is_grad_enabled()


def test_dispatch_overhead_is_measured() -> None:
    """Measures the guard's per-call overhead (printed; the target lives in BENCHMARKS.md, not in an assert)."""
    x = torch.randn(4, 8)
    provider = DoublingReluProvider()
    plan = _plan(provider, Sample((x,), {}))
    runtime = KernelProviderRuntime(ReluNet(), plan)
    dispatch = runtime._dispatch["relu"]
    n = 20000
    guarded = timeit.timeit(lambda: dispatch(x), number=n) / n
    direct = timeit.timeit(lambda: provider(x), number=n) / n
    print(f"dispatch overhead: {(guarded - direct) * 1e6:.2f} us per call")
    assert provider.calls == 2 * n
