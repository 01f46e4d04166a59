"""Thread-local dispatch: a plan reaches only the thread running the planned forward, and never stays patched."""

from __future__ import annotations

import random
import threading

import torch
import torch.nn.functional as F
from torch import nn

from forge.plan import KernelOptimizationPlan, PlanEntry
from forge.runtime import patched_functions
from forge.samples import Sample
from tests.forge.providers_for_tests import _FunctionProvider

STOCK_RELU = F.relu
TIMEOUT = 30


class ThreadRecordingRelu(_FunctionProvider, type_name="test_thread_recording_relu"):
    """Exact relu that records which thread called it."""

    function_name = "relu"

    def __init__(self, function_name: str | None = None) -> None:
        super().__init__(function_name)
        self.threads: list[int] = []

    def _call(self, x: torch.Tensor, inplace: bool = False) -> torch.Tensor:
        self.calls += 1
        self.threads.append(threading.get_ident())
        return torch.clamp_min(x, 0)


class PausingNet(nn.Module):
    """Calls relu, then waits inside forward until released, then calls relu again."""

    def __init__(self) -> None:
        super().__init__()
        self.inside = threading.Event()
        self.release = threading.Event()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(x)
        self.inside.set()
        assert self.release.wait(TIMEOUT)
        return F.relu(y - 1)


def _plan(provider, x: torch.Tensor) -> KernelOptimizationPlan:
    samples = (Sample((x,), {}),)
    provider.prepare(list(samples))
    return KernelOptimizationPlan(entries=(PlanEntry(provider=provider, signatures=samples),))


def _run(net: nn.Module, x: torch.Tensor, results: dict, key: str) -> threading.Thread:
    def target() -> None:
        results[key] = net(x)

    thread = threading.Thread(target=target)
    thread.start()
    return thread


def test_other_threads_see_stock_pytorch_while_a_planned_forward_runs() -> None:
    x = torch.randn(4, 8)
    provider = ThreadRecordingRelu()
    net = PausingNet()
    results: dict = {}
    with _plan(provider, x).apply(net):
        worker = _run(net, x, results, "net")
        assert net.inside.wait(TIMEOUT)
        assert patched_functions() == {"relu": 1} and F.relu is not STOCK_RELU  # routed process-wide...
        out = F.relu(x)  # ...but this thread is outside the model: stock PyTorch
        assert torch.equal(out, torch.relu(x)) and provider.calls == 1
        net.release.set()
        worker.join(TIMEOUT)
    assert provider.calls == 2 and set(provider.threads) == {worker.ident}
    assert torch.equal(results["net"], torch.relu(torch.relu(x) - 1))
    assert F.relu is STOCK_RELU and patched_functions() == {}


def test_two_plans_in_two_threads_finishing_out_of_order_leave_no_patch() -> None:
    x = torch.randn(4, 8)
    first, second = ThreadRecordingRelu(), ThreadRecordingRelu()
    net_a, net_b = PausingNet(), PausingNet()
    results: dict = {}
    with _plan(first, x).apply(net_a), _plan(second, x).apply(net_b):
        thread_a = _run(net_a, x, results, "a")
        assert net_a.inside.wait(TIMEOUT)
        thread_b = _run(net_b, x, results, "b")
        assert net_b.inside.wait(TIMEOUT)
        assert patched_functions() == {"relu": 2}
        net_a.release.set()  # the first to enter leaves first: not LIFO
        thread_a.join(TIMEOUT)
        assert patched_functions() == {"relu": 1} and F.relu is not STOCK_RELU
        net_b.release.set()
        thread_b.join(TIMEOUT)
    assert F.relu is STOCK_RELU and patched_functions() == {}
    assert first.calls == 2 and set(first.threads) == {thread_a.ident}
    assert second.calls == 2 and set(second.threads) == {thread_b.ident}
    expected = torch.relu(torch.relu(x) - 1)
    assert torch.equal(results["a"], expected) and torch.equal(results["b"], expected)


class ReluNet(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x)


def test_concurrent_forwards_and_outside_calls_never_cross() -> None:
    x = torch.randn(4, 8)
    providers = [ThreadRecordingRelu(), ThreadRecordingRelu()]
    nets = [ReluNet(), ReluNet()]
    plans = [_plan(p, x) for p in providers]
    errors: list[BaseException] = []
    outside_ident: list[int] = []
    start = threading.Barrier(3)

    def planned(index: int) -> None:
        try:
            start.wait(TIMEOUT)
            for _ in range(200):
                assert torch.equal(nets[index](x), torch.relu(x))
                if random.random() < 0.2:
                    threading.Event().wait(0.0005)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    def outside() -> None:
        outside_ident.append(threading.get_ident())
        try:
            start.wait(TIMEOUT)
            for _ in range(400):
                assert torch.equal(F.relu(x), torch.relu(x))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    with plans[0].apply(nets[0]), plans[1].apply(nets[1]):
        threads = [threading.Thread(target=planned, args=(i,)) for i in range(2)] + [threading.Thread(target=outside)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
    assert not errors
    assert providers[0].calls == 200 and providers[1].calls == 200
    assert set(providers[0].threads) == {threads[0].ident} and set(providers[1].threads) == {threads[1].ident}
    assert outside_ident[0] not in providers[0].threads + providers[1].threads
    assert F.relu is STOCK_RELU and patched_functions() == {}
