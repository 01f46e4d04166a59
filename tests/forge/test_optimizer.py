"""KernelOptimizer end to end on CPU with real providers, real timing and real generators (threads)."""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import forge.functional
from forge.checking import KernelUtils
from forge.optimizer import KernelOptimizer
from forge.plan import KernelOptimizationPlan, PlanEntry
from forge.provider import KernelGenerationResult, KernelGenerator
from forge.samples import Sample
from tests.forge.providers_for_tests import (
    FastGeluProvider,
    RaisingGeluProvider,
    SlowGeluProvider,
    WrongGeluProvider,
)

FAST_UTILS = KernelUtils(fresh_inputs_per_sample=1, rounds=15, warmup=2, min_run_time_s=0.05)


class GeluNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.proj(x))


@pytest.fixture
def slow_baseline(monkeypatch):
    """Make PyTorch's gelu (the baseline) slow, so a plain torch reimplementation is genuinely faster."""
    real = forge.functional._ORIGINALS["gelu"]

    def slowed_gelu(x, approximate="none"):
        time.sleep(0.003)
        return real(x, approximate=approximate)

    # Both what the optimizer treats as PyTorch's gelu and what the model actually calls.
    monkeypatch.setitem(forge.functional._ORIGINALS, "gelu", slowed_gelu)
    monkeypatch.setattr(F, "gelu", slowed_gelu)
    return slowed_gelu


def _data() -> list[Sample]:
    return [Sample((torch.randn(8, 16),), {}) for _ in range(2)]


def test_picks_the_faster_correct_provider(slow_baseline) -> None:
    fast, slow, wrong, raising = FastGeluProvider(), SlowGeluProvider(), WrongGeluProvider(), RaisingGeluProvider()
    optimizer = KernelOptimizer(kernel_providers=[slow, wrong, raising, fast], kernel_utils=FAST_UTILS)
    net = GeluNet()
    plan = optimizer.make_plan(net, _data())
    assert [e.provider for e in plan.entries] == [fast]
    status = dict(zip(optimizer.report["candidate"], optimizer.report["status"], strict=True))
    assert status["FastGeluProvider"] == "selected"
    # slower than the baseline (on a loaded machine sleep-based timings can tie; it must never be selected)
    assert status["SlowGeluProvider"] in {"slower", "valid"}
    assert status["WrongGeluProvider"] == "invalid"
    assert status["RaisingGeluProvider"] == "invalid"
    assert "raised" in optimizer.report.set_index("candidate").loc["RaisingGeluProvider", "error"]
    assert plan.entries[0].baseline_ms > plan.entries[0].latency_ms
    assert set(optimizer.profile_summary["function_name"]) >= {"gelu", "linear"}
    with plan.apply(net) as runtime:
        net(torch.randn(8, 16))
    assert runtime.stats["gelu"].provider_calls == 1


def test_no_winner_when_nothing_beats_pytorch() -> None:
    optimizer = KernelOptimizer(kernel_providers=[SlowGeluProvider()], kernel_utils=FAST_UTILS)
    plan = optimizer.make_plan(GeluNet(), _data())
    assert len(plan) == 0
    assert list(optimizer.report["status"])[0] == "baseline"
    assert optimizer.report["status"].iloc[1] in {"slower", "not significant"}


class ThreadGenerator(KernelGenerator):
    """A real asynchronous generator: work runs on a thread pool; `delay` seconds before the result."""

    def __init__(self, name: str, make_result, delay: float = 0.0) -> None:
        self._name = name
        self._make_result = make_result
        self._delay = delay
        self._pool = cf.ThreadPoolExecutor(max_workers=1)
        self.cancelled = threading.Event()

    @property
    def name(self) -> str:
        return self._name

    def supports_functions(self) -> list[str]:
        return ["gelu"]

    def prepare(self, function: str, samples) -> bool:
        return True

    def submit(self, function: str, samples) -> cf.Future:
        def work():
            if self.cancelled.wait(self._delay):
                raise cf.CancelledError()
            return self._make_result(function, samples)

        return self._pool.submit(work)

    def cancel(self) -> None:
        self.cancelled.set()


def _fast_result(function, samples):
    provider = FastGeluProvider()
    provider.prepare(samples)
    return KernelGenerationResult(function=function, provider=provider, description="thread-made gelu")


def test_generated_candidates_use_the_same_path_and_timeouts_are_reported(slow_baseline, caplog) -> None:
    quick = ThreadGenerator("quick", _fast_result)
    stuck = ThreadGenerator("stuck", _fast_result, delay=60)
    broken = ThreadGenerator("broken", lambda f, s: (_ for _ in ()).throw(RuntimeError("remote failure")))
    optimizer = KernelOptimizer(
        kernel_generators=[stuck, broken, quick],
        kernel_utils=FAST_UTILS,
        generator_min_time_share_percent=0.0,
        generation_timeout=3.0,
    )
    start = time.monotonic()
    with caplog.at_level("WARNING"):
        plan = optimizer.make_plan(GeluNet(), _data())
    assert time.monotonic() - start < 30
    assert plan.functions == ["gelu"] and plan.entries[0].source == "generated"
    rows = optimizer.report.set_index("candidate")
    assert rows.loc["stuck", "status"] == "timeout"
    assert rows.loc["broken", "status"] == "failed" and "remote failure" in rows.loc["broken", "error"]
    assert "timed out" in caplog.text and "stuck for gelu" in caplog.text
    assert stuck.cancelled.is_set()


def test_generator_threshold_excludes_small_functions(slow_baseline) -> None:
    quick = ThreadGenerator("quick", _fast_result)
    optimizer = KernelOptimizer(kernel_generators=quick, kernel_utils=FAST_UTILS,
                                generator_min_time_share_percent=100.0)
    assert len(optimizer.make_plan(GeluNet(), _data())) == 0


@pytest.mark.parametrize("value", [-1, 100.1, float("nan"), float("inf")])
def test_thresholds_outside_0_100_are_rejected(value) -> None:
    with pytest.raises(ValueError, match="provider_min_time_share_percent"):
        KernelOptimizer(provider_min_time_share_percent=value)
    with pytest.raises(ValueError, match="generator_min_time_share_percent"):
        KernelOptimizer(generator_min_time_share_percent=value)


def test_unresolvable_module_and_bad_sources() -> None:
    with pytest.raises(ValueError, match="module must be given"):
        KernelOptimizer(kernel_providers=FastGeluProvider()).make_plan(lambda x: x, _data())
    with pytest.raises(TypeError, match="kernel_providers"):
        KernelOptimizer(kernel_providers=[F.gelu])


def test_generation_timeout_default_from_env(monkeypatch) -> None:
    monkeypatch.setenv("KFORGE_GENERATION_TIMEOUT", "12.5")
    assert KernelOptimizer().generation_timeout == 12.5
    monkeypatch.delenv("KFORGE_GENERATION_TIMEOUT")
    assert KernelOptimizer().generation_timeout == 21600.0
    monkeypatch.setenv("KFORGE_GENERATION_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="KFORGE_GENERATION_TIMEOUT"):
        KernelOptimizer()


def test_empty_sources_give_empty_plan() -> None:
    assert KernelOptimizer().make_plan(GeluNet(), _data()) == KernelOptimizationPlan(
        environment=KernelOptimizer().make_plan(GeluNet(), _data()).environment
    )


def test_end_to_end_check_keeps_a_plan_that_speeds_the_model_up(slow_baseline) -> None:
    optimizer = KernelOptimizer(kernel_providers=[FastGeluProvider()], kernel_utils=FAST_UTILS)
    plan = optimizer.make_plan(GeluNet(), _data())
    assert plan.functions == ["gelu"]
    e2e = optimizer.end_to_end.set_index("variant")
    assert e2e.loc["plan", "median_ms"] < e2e.loc["eager", "median_ms"]


def test_end_to_end_check_drops_an_entry_that_slows_the_model_down() -> None:
    """Per-call selection can be fooled (e.g. by host overhead that only shows inside a model): the whole-model
    check catches a plan whose entry makes the model slower and drops that entry."""
    x = torch.randn(8, 16)
    slow = SlowGeluProvider()
    slow.prepare([Sample((x,), {})])
    entry = PlanEntry(provider=slow, signatures=(Sample((x,), {}),), latency_ms=0.1, baseline_ms=0.2)
    optimizer = KernelOptimizer(kernel_providers=[slow], kernel_utils=FAST_UTILS)
    optimizer._rows = [{"function": "gelu", "candidate": slow.name, "source": "static", "status": "selected",
                        "latency_ms": 0.1, "spread": 0.0, "speedup": 2.0, "error": None}]
    net = GeluNet()
    kept = optimizer._check_end_to_end(net, [Sample((torch.randn(8, 16),), {})], net, [entry])
    assert kept == []
    assert optimizer._rows[0]["status"] == "dropped (slower end to end)"
    assert "+ gelu" in set(optimizer.end_to_end["variant"])
