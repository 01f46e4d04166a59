"""KernelOptimizer end to end on CPU with real providers, real timing and real generators (threads)."""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import os
import signal
import threading
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import forge.functional
from forge.checking import KernelUtils
from forge.functional import original_function
from forge.optimizer import KernelOptimizer, ReportStatus
from forge.outcome import Outcome
from forge.plan import KernelOptimizationPlan, PlanEntry
from forge.provider import KernelGenerationResult, KernelGenerator
from forge.samples import Sample
from tests.forge.providers_for_tests import (
    FastGeluProvider,
    RaisingGeluProvider,
    SlowGeluProvider,
    WrongGeluProvider,
    _FunctionProvider,
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
    assert status["WrongGeluProvider"] == ReportStatus.MISMATCH == "mismatch"
    assert status["RaisingGeluProvider"] == ReportStatus.RUNTIME_ERROR == "runtime_error"
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
    assert e2e.loc["plan", "median_ms"] < e2e.loc["plan", "baseline_ms"]
    assert e2e.loc["plan", "verdict"] == "kept: faster"


def test_end_to_end_check_drops_an_entry_that_slows_the_model_down() -> None:
    """Per-call selection can be fooled (e.g. by host overhead that only shows inside a model): the whole-model
    check catches a plan whose entry makes the model slower and drops that entry."""
    class SlowerGeluProvider(SlowGeluProvider, type_name="test_slower_gelu"):
        """30 ms per call: far beyond the scheduling noise of a loaded 2-core machine (10 ms time slices)."""

        def _call(self, x, approximate="none"):
            time.sleep(0.03)
            return super()._call(x, approximate)

    x = torch.randn(8, 16)
    slow = SlowerGeluProvider()
    slow.prepare([Sample((x,), {})])
    entry = PlanEntry(provider=slow, signatures=(Sample((x,), {}),), latency_ms=0.1, baseline_ms=0.2)
    optimizer = KernelOptimizer(kernel_providers=[slow], kernel_utils=FAST_UTILS)
    optimizer._rows = [{"function": "gelu", "candidate": slow.name, "source": "static", "status": "selected",
                        "latency_ms": 0.1, "spread": 0.0, "speedup": 2.0, "error": None}]
    net = GeluNet()
    kept = optimizer._check_end_to_end(net, [Sample((torch.randn(8, 16),), {})], net, [entry])
    assert kept == []
    assert optimizer._rows[0]["status"] == "dropped (not faster end to end)"
    assert optimizer.end_to_end.iloc[0]["verdict"] == "loses: dropping an entry"
    assert "not faster with it" in optimizer._rows[0]["error"]


# ---------------------------------------------------------------------------------------------------------
# Harness failures and candidates that try to end the process
# ---------------------------------------------------------------------------------------------------------
class ExitingGeluProvider(_FunctionProvider, type_name="test_exiting_gelu"):
    """Calls sys.exit from its kernel (at call time) or from prepare."""

    exit_in_prepare = False

    def _prepare(self, samples) -> bool:
        if self.exit_in_prepare:
            raise SystemExit("bye from prepare")
        return True

    def _call(self, x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
        raise SystemExit(7)


class InterruptingGeluProvider(_FunctionProvider, type_name="test_interrupting_gelu"):
    """Raises KeyboardInterrupt itself (no signal): candidate code, contained."""

    def _call(self, x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
        raise KeyboardInterrupt


class CtrlCGeluProvider(_FunctionProvider, type_name="test_ctrl_c_gelu"):
    """The user presses Ctrl-C while this kernel runs (a real SIGINT to the process)."""

    def _call(self, x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
        os.kill(os.getpid(), signal.SIGINT)
        return original_function("gelu")(x, approximate=approximate)


def test_a_kernel_calling_sys_exit_is_recorded_and_make_plan_returns(slow_baseline) -> None:
    in_prepare = ExitingGeluProvider()
    in_prepare.exit_in_prepare = True
    providers = [ExitingGeluProvider(), in_prepare, InterruptingGeluProvider(), FastGeluProvider()]
    optimizer = KernelOptimizer(kernel_providers=providers, kernel_utils=FAST_UTILS, end_to_end_check=False)
    plan = optimizer.make_plan(GeluNet(), _data())
    assert plan.functions == ["gelu"]  # the plan goes on with the good provider
    rows = optimizer.report.set_index("candidate")
    exiting = rows.loc["ExitingGeluProvider"]
    assert list(exiting["status"]) == [ReportStatus.RUNTIME_ERROR] * 2
    errors = list(exiting["error"])
    assert any("SystemExit: 7" in e for e in errors) and any("bye from prepare" in e for e in errors)
    assert rows.loc["InterruptingGeluProvider", "status"] == ReportStatus.RUNTIME_ERROR
    assert "KeyboardInterrupt" in rows.loc["InterruptingGeluProvider", "error"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_generation_thread_ending_in_system_exit_is_recorded(slow_baseline) -> None:
    exiting = ThreadGenerator("exiting", lambda f, s: (_ for _ in ()).throw(SystemExit(3)))
    optimizer = KernelOptimizer(kernel_generators=exiting, kernel_utils=FAST_UTILS,
                                generator_min_time_share_percent=0.0, end_to_end_check=False)
    assert len(optimizer.make_plan(GeluNet(), _data())) == 0
    row = optimizer.report.set_index("candidate").loc["exiting"]
    assert row["status"] == ReportStatus.RUNTIME_ERROR and "SystemExit" in row["error"]


def test_the_users_ctrl_c_and_the_harness_own_interrupt_still_propagate(slow_baseline) -> None:
    optimizer = KernelOptimizer(kernel_providers=CtrlCGeluProvider(), kernel_utils=FAST_UTILS)
    with pytest.raises(KeyboardInterrupt):
        optimizer.make_plan(GeluNet(), _data())

    class InterruptedUtils(KernelUtils):
        def benchmark(self, fn, samples):
            raise KeyboardInterrupt  # raised by the harness, outside any candidate frame

    optimizer = KernelOptimizer(kernel_providers=FastGeluProvider(), kernel_utils=InterruptedUtils(
        fresh_inputs_per_sample=0))
    with pytest.raises(KeyboardInterrupt):
        optimizer.make_plan(GeluNet(), _data())
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@dataclasses.dataclass(frozen=True)
class ReferenceFailsUtils(KernelUtils):
    """The real oracle, with a reference that fails the way the harness can: it raises, or runs out of memory."""

    error_to_raise: BaseException | None = None

    def validate(self, reference_fn, candidate, samples):
        def reference(*args, **kwargs):
            raise self.error_to_raise

        return super().validate(reference, candidate, samples)


@pytest.mark.parametrize("error", [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 14.00 GiB"),
                                   MemoryError(), ValueError("the reference is broken")])
def test_a_failing_reference_is_a_harness_error_not_the_candidates(error) -> None:
    utils = ReferenceFailsUtils(error_to_raise=error, fresh_inputs_per_sample=0, rounds=3, warmup=1, min_run_time_s=0.0)
    optimizer = KernelOptimizer(kernel_providers=FastGeluProvider(), kernel_utils=utils, end_to_end_check=False)
    assert len(optimizer.make_plan(GeluNet(), _data())) == 0
    row = optimizer.report.set_index("candidate").loc["FastGeluProvider"]
    assert row["status"] == ReportStatus.HARNESS_ERROR and row["outcome"] == Outcome.HARNESS_ERROR
    assert "the reference" in row["error"] and "the candidate cannot be judged" in row["error"]
    assert ("ran out of memory" in row["error"]) == (not isinstance(error, ValueError))


class _TimedPassCheat(FastGeluProvider, type_name="test_timed_pass_cheat_gelu"):
    """Correct whenever it is validated; returns zeros once it is being timed (a perfect timed-pass detector)."""

    timed = False

    def _call(self, x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
        out = super()._call(x, approximate)
        return torch.zeros_like(out) if self.timed else out


def test_a_candidate_wrong_only_while_timed_is_a_spot_check_mismatch(slow_baseline, monkeypatch) -> None:
    cheat = _TimedPassCheat()
    select = KernelOptimizer._select

    def timing_starts(self, searches):  # type: ignore[no-untyped-def]
        cheat.timed = True
        return select(self, searches)

    monkeypatch.setattr(KernelOptimizer, "_select", timing_starts)
    optimizer = KernelOptimizer(kernel_providers=[cheat], kernel_utils=FAST_UTILS)
    plan = optimizer.make_plan(GeluNet(), _data())
    assert plan.entries == ()
    row = optimizer.report.set_index("candidate").loc["_TimedPassCheat"]
    assert row["status"] == ReportStatus.MISMATCH
    assert "spot check of timed pass" in row["error"] and "max abs error" in row["error"]


def test_optimize_returns_everything_it_found_as_one_frozen_result(slow_baseline) -> None:
    import dataclasses

    from forge.optimizer import PlanResult

    optimizer = KernelOptimizer(kernel_providers=[FastGeluProvider()], kernel_utils=FAST_UTILS, end_to_end_blocks=5)
    result = optimizer.optimize(GeluNet(), _data())
    assert isinstance(result, PlanResult) and result is optimizer.last_result
    assert result.plan.functions == ["gelu"] and set(result.report["status"]) >= {"baseline", "selected"}
    assert result.plan_check is not None and result.clock is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.plan = None
    second = optimizer.optimize(GeluNet(), _data(), execution="cuda_graphs")  # a new run, the first result stays
    assert second is not result and result.plan.execution.value == "eager"
