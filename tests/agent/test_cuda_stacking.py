"""A CUDA-language provider in a plan stacks like a Triton one: eager, `torch.compile(fullgraph=True)`, CUDA graphs.

The plan holds a `GeneratedKernelProvider` with the hand-written CUDA `rms_norm` candidate
(`agent.languages.cuda.reference_candidates`), applied to a small module with `forge.runtime`. Each mode checks the
output against stock PyTorch, that the call reached the provider (the runtime's dispatch stats) and that the
candidate's own kernel was launched (the CUDA runtime's launch observer). Under capture the launch must go to torch's
current stream (the capture stream): a launch on any other stream fails the capture. Replays run no Python, so
their outputs, right for inputs written after the capture, show the kernel was captured.

GPU only: `python -m pytest -q -m cuda tests/agent/test_cuda_stacking.py`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch import nn

from agent.languages.cuda.reference_candidates import RMS_NORM_FILE
from agent.languages.cuda.toolchain import TOOLCHAIN_ENV
from agent.provider import GeneratedKernelProvider
from forge.functional import original_function
from forge.plan import KernelOptimizationPlan, PlanEntry
from forge.runtime import patched_functions
from forge.samples import Sample

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

H = 1024
EPS = 1e-6


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("weight", torch.randn(H, device="cuda"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x * 2, (H,), self.weight, EPS) + 1


def _reference(net: Net, x: torch.Tensor) -> torch.Tensor:
    return original_function("rms_norm")(x * 2, (H,), net.weight, EPS) + 1


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[list[str]]:
    """A fresh build cache and the names of the CUDA kernels launched while the test runs."""
    from agent.languages.cuda import runtime

    monkeypatch.setenv("KFORGE_CUDA_CACHE", str(tmp_path / "cuda_cache"))
    monkeypatch.delenv(TOOLCHAIN_ENV, raising=False)
    runtime.clear_loaded()
    seen: list[str] = []

    def observer(name: str, grid: tuple, block: tuple, shared: int) -> None:
        seen.append(name)

    runtime.add_launch_observer(observer)
    torch._dynamo.reset()
    yield seen
    runtime.remove_launch_observer(observer)
    torch._dynamo.reset()


def _plan(net: Net, x: torch.Tensor, cache_dir: Path) -> tuple[KernelOptimizationPlan, GeneratedKernelProvider]:
    sample = Sample((x * 2, (H,), net.weight, EPS), {})
    provider = GeneratedKernelProvider("rms_norm", RMS_NORM_FILE, language="cuda", signatures=[sample],
                                       cache_dir=cache_dir)
    assert provider.prepare([sample])  # screens, builds (or hits the build cache) and loads the CUDA source
    return KernelOptimizationPlan(entries=(PlanEntry(provider=provider, signatures=(sample,)),)), provider


def test_cuda_provider_runs_eagerly_in_a_plan(launches: list[str], tmp_path: Path) -> None:
    net, x = Net(), torch.randn(32, H, device="cuda")
    plan, _ = _plan(net, x, tmp_path)
    with plan.apply(net) as runtime:
        out = net(x)
        other = net(x[:16].clone())  # a shape it was not validated on: stock PyTorch
    torch.testing.assert_close(out, _reference(net, x), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(other, _reference(net, x[:16]), atol=1e-5, rtol=1e-5)
    stats = runtime.stats["rms_norm"]
    assert (stats.provider_calls, stats.fallback_calls, stats.provider_errors, launches) == (1, 1, 0, ["rms_f32"])
    assert patched_functions() == {}


def test_cuda_provider_under_torch_compile_fullgraph(launches: list[str], tmp_path: Path) -> None:
    net, x = Net(), torch.randn(32, H, device="cuda")
    plan, _ = _plan(net, x, tmp_path)
    compiled = torch.compile(net, fullgraph=True)
    with plan.apply(net) as runtime:
        for _ in range(3):
            y = torch.randn_like(x)
            torch.testing.assert_close(compiled(y), _reference(net, y), atol=1e-5, rtol=1e-5)
    stats = runtime.stats["rms_norm"]
    assert (stats.provider_calls, stats.provider_errors, launches) == (3, 0, ["rms_f32"] * 3)


def test_cuda_provider_is_captured_by_a_cuda_graph_and_replays(launches: list[str], tmp_path: Path) -> None:
    net, static_x = Net(), torch.randn(32, H, device="cuda")
    plan, _ = _plan(net, static_x, tmp_path)
    graph = torch.cuda.CUDAGraph()
    with plan.apply(net) as runtime:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            net(static_x)  # warm-up off the capture stream: loads the cubin outside capture
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(graph):  # the launch must use the capture stream (torch's current one)
            static_out = net(static_x)
    assert runtime.stats["rms_norm"].provider_calls == 2 and launches == ["rms_f32"] * 2
    for _ in range(3):
        new = torch.randn_like(static_x)
        static_x.copy_(new)
        graph.replay()
        torch.testing.assert_close(static_out, _reference(net, new), atol=1e-5, rtol=1e-5)
    assert launches == ["rms_f32"] * 2  # replays run no Python


def test_make_graphed_callables_accepts_a_module_planned_with_a_cuda_provider(launches: list[str],
                                                                              tmp_path: Path) -> None:
    net, x = Net(), torch.randn(32, H, device="cuda")
    plan, _ = _plan(net, x, tmp_path)
    with plan.apply(net) as runtime:
        graphed = torch.cuda.make_graphed_callables(net, (x,))
        calls, launched = runtime.stats["rms_norm"].provider_calls, len(launches)
        y = torch.randn_like(x)
        torch.testing.assert_close(graphed(y), _reference(net, y), atol=1e-5, rtol=1e-5)
    assert calls > 0 and launched == calls and runtime.stats["rms_norm"].provider_calls == calls
