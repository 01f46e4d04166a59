"""Plans under CUDA graphs: captured with `torch.cuda.graph`, `make_graphed_callables` and reduce-overhead compile.

Skipped without CUDA; run on the GPU host with `python -m pytest -q -m cuda tests/forge/test_runtime_cuda.py`.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch import nn

from forge.plan import KernelOptimizationPlan, PlanEntry
from forge.runtime import patched_functions
from forge.samples import Sample
from tests.forge.providers_for_tests import DoublingReluProvider

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


class Net(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x * 2 + 1) - 3


def _plan(x: torch.Tensor) -> tuple[KernelOptimizationPlan, DoublingReluProvider]:
    provider = DoublingReluProvider()
    samples = (Sample((x * 2 + 1,), {}),)
    provider.prepare(list(samples))
    return KernelOptimizationPlan(entries=(PlanEntry(provider=provider, signatures=samples),)), provider


def _reference(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x * 2 + 1) - 3


def test_plan_captured_by_cuda_graph_replays_without_the_runtime() -> None:
    static_x = torch.randn(64, 128, device="cuda")
    plan, provider = _plan(static_x)
    net = Net()
    graph = torch.cuda.CUDAGraph()
    with plan.apply(net):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            net(static_x)  # warm-up off the capture stream
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(graph):
            static_out = net(static_x)
    assert provider.calls == 2 and patched_functions() == {}
    for _ in range(3):
        new = torch.randn_like(static_x)
        static_x.copy_(new)
        graph.replay()  # no Python: the provider's kernels were captured
        torch.testing.assert_close(static_out, _reference(new))
    assert provider.calls == 2


def test_make_graphed_callables_accepts_a_planned_module() -> None:
    x = torch.randn(64, 128, device="cuda")
    plan, provider = _plan(x)
    net = Net()
    with plan.apply(net):
        graphed = torch.cuda.make_graphed_callables(net, (x,))  # refuses modules with hooks: the runtime has none
        calls = provider.calls
        y = torch.randn_like(x)
        out = graphed(y)
        torch.testing.assert_close(out, _reference(y))
    assert calls > 0 and provider.calls == calls  # replays run no Python


def test_reduce_overhead_compile_runs_the_provider_op() -> None:
    torch._dynamo.reset()
    x = torch.randn(64, 128, device="cuda")
    plan, provider = _plan(x)
    net = Net()
    compiled = torch.compile(net, mode="reduce-overhead")
    with plan.apply(net) as runtime:
        for _ in range(4):
            y = torch.randn_like(x)
            torch.testing.assert_close(compiled(y).clone(), _reference(y))
    assert provider.calls >= 1 and runtime.stats["relu"].provider_calls >= 1
    torch._dynamo.reset()
